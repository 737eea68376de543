"""Self-distillation: ensemble mask, loss, gradients, data reader, answer cache, file round trip."""

import json

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from ppd_core.calibration.records import beside, read_records
from ppd_core.training.distillation import cut_layout, student_logits, teacher_pass, teacher_targets, valid_cuts
from ppd_core.drafters.prompt_tokens import PromptTokens
from ppd_core.training.answers import build_answer_cache, read_cache
from ppd_core.training.data import iter_json_array, normalize, prompt_histories, read_conversations
from ppd_core.training.prompt_tensors import check_compatible, initial_prompt_tokens
from ppd_core.training.distill import acceptance_hits, depth_weights, distill_loss


def test_ensemble_mask_member_sees_context_and_own_chain_only():
    n, V, L = 3, 2, 10
    cuts = torch.tensor([4, 7])
    layout = cut_layout(cuts, n, V, L)
    assert layout.allowed.shape == (2 * n * V, L + 2 * n * V)
    for i, cut in enumerate(cuts.tolist()):
        for k in range(n):
            for j in range(V):
                row = i * n * V + k * V + j
                seen = set(torch.nonzero(layout.allowed[row]).flatten().tolist())
                context = set(range(cut + 1))
                chain = {L + i * n * V + kk * V + j for kk in range(k + 1)}
                assert seen == context | chain
                assert layout.positions[row] == cut + k + 1
                assert layout.embedding_index[row] == k * V + j


def test_unchained_layout_rows_see_the_context_and_themselves_only():
    n, V, L = 3, 2, 10
    cuts = torch.tensor([4, 7])
    chained, alone = cut_layout(cuts, n, V, L), cut_layout(cuts, n, V, L, chained=False)
    assert torch.equal(chained.positions, alone.positions) and torch.equal(chained.embedding_index, alone.embedding_index)
    for row in range(2 * n * V):
        seen = set(torch.nonzero(alone.allowed[row]).flatten().tolist())
        assert seen == set(range(cuts[row // (n * V)].item() + 1)) | {L + row}


def test_student_rows_equal_sequential_forward():
    model = tiny_llama(seed=6)
    n, V = 3, 2
    table = torch.randn(n * V, 64)
    ids = list(range(3, 23))
    cache, teacher = teacher_pass(model, ids)
    cuts = torch.tensor([5, 11])
    with torch.no_grad():
        student = student_logits(model, cache, table, cuts, n, V)  # [C, n, vocab]
    assert cache.get_seq_length() == len(ids)  # student rows were removed again
    embedding = model.get_input_embeddings()
    for i, cut in enumerate(cuts.tolist()):
        for k in range(n):
            members = []
            for j in range(V):
                seq = torch.cat([embedding(torch.tensor(ids[: cut + 1])), table[[kk * V + j for kk in range(k + 1)]]])
                with torch.no_grad():
                    members.append(model(inputs_embeds=seq[None]).logits[0, -1])
            torch.testing.assert_close(student[i, k], torch.stack(members).mean(0), atol=1e-4, rtol=1e-4)
    # teacher of prompt token k at cut c is the model's distribution at position c + k
    targets = teacher_targets(teacher, cuts, n)
    assert torch.equal(targets[1, 2], teacher[11 + 3])


def test_one_step_lowers_the_loss_and_only_prompt_embeddings_get_gradients():
    model = tiny_llama(seed=7)
    n, V = 3, 2
    embeddings = torch.nn.Parameter(torch.randn(n, V, 64))
    optimizer = torch.optim.SGD([embeddings], lr=0.05)
    ids = list(range(40, 80))
    cache, teacher = teacher_pass(model, ids)
    cuts = valid_cuts(10, len(ids), n)

    def loss_now():
        return distill_loss(student_logits(model, cache, embeddings.view(n * V, -1), cuts, n, V), teacher_targets(teacher, cuts, n))

    before = loss_now()
    before.backward()
    assert embeddings.grad is not None and embeddings.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())
    optimizer.step()
    with torch.no_grad():
        assert loss_now() < before


def test_loss_formula_and_hits():
    teacher = torch.randn(4, 3, 11)
    assert distill_loss(teacher.clone(), teacher).abs() < 1e-6
    student = torch.randn(4, 3, 11)
    p = torch.softmax(teacher, -1)
    kl = (p * (torch.log_softmax(teacher, -1) - torch.log_softmax(student, -1))).sum(-1).mean(0)  # [3]
    expected = (kl * torch.tensor([1.0, 0.8, 0.64])).sum() / 3
    torch.testing.assert_close(distill_loss(student, teacher), expected)
    hits = acceptance_hits(teacher, teacher)
    assert hits.tolist() == [[4, 4]] * 3


def test_the_other_losses_and_the_curriculum_weights_against_their_formulas():
    torch.manual_seed(3)
    teacher, student = torch.randn(4, 3, 40), torch.randn(4, 3, 40)
    log_student = torch.log_softmax(student, -1)
    hard = torch.stack([torch.stack([-log_student[c, k, teacher[c, k].argmax()] for k in range(3)]) for c in range(4)])
    top = torch.zeros(4, 3)
    for c in range(4):
        for k in range(3):
            best = sorted(range(40), key=lambda t: -teacher[c, k, t].item())[:20]
            q = torch.softmax(teacher[c, k, best], -1)
            top[c, k] = -(q * log_student[c, k, best]).sum()
    decay = torch.tensor([1.0, 0.8, 0.64])
    torch.testing.assert_close(distill_loss(student, teacher, kind="hard"), (hard.mean(0) * decay).sum() / 3)
    torch.testing.assert_close(distill_loss(student, teacher, kind="top20"), (top.mean(0) * decay).sum() / 3)
    first = depth_weights(3, 0.8, depths=1)
    assert first.tolist() == [1.0, 0.0, 0.0]
    torch.testing.assert_close(distill_loss(student, teacher, kind="hard", weights=first), hard[:, 0].mean() / 3)
    with pytest.raises(ValueError, match="unknown distillation loss 'l2'"):
        distill_loss(student, teacher, kind="l2")


def test_sharegpt_reader_on_a_truncated_file(tmp_path):
    records = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]} for i in range(5)]
    text = json.dumps(records)
    cut = text[: text.index('"id": "4"') + 12]  # cut off inside the 5th element
    path = tmp_path / "sharegpt.json"
    path.write_text(cut)
    conversations = read_conversations(path)
    assert len(conversations) == 4
    assert conversations[0] == [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "a0"}]
    assert len(list(iter_json_array(cut))) == 4
    assert normalize({"messages": [{"role": "user", "content": "hi"}]}) == [{"role": "user", "content": "hi"}]
    assert prompt_histories(conversations)[2] == [{"role": "user", "content": "q2"}]


def test_user_jsonl_conversations(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]}) + "\n")
    assert read_conversations(path) == [[{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]]


class CharTokenizer:
    """Just enough of a tokenizer for the answer cache: one id per character."""

    pad_token_id = 0

    def apply_chat_template(self, history, add_generation_prompt, tokenize):
        return [1 + (ord(c) % 100) for m in history for c in m["content"]] + [2]


def test_answer_cache_resumes(tmp_path):
    model = tiny_llama(seed=8)
    histories = [[{"role": "user", "content": f"question number {i}"}] for i in range(6)]
    path = tmp_path / "answers.jsonl"
    first = build_answer_cache(model, CharTokenizer(), histories, path, 3, max_new_tokens=5, batch_size=2, eos_ids=[127])
    assert len(first) == 3
    with path.open("a") as handle:
        handle.write('{"index": 99, "prom')  # an interrupted write
    second = build_answer_cache(model, CharTokenizer(), histories, path, 6, max_new_tokens=5, batch_size=2, eos_ids=[127])
    assert len(second) == 6 and sorted(r["index"] for r in second) == list(range(6))
    assert [r["ids"] for r in read_cache(path)][:3] == [r["ids"] for r in first]
    # answers are the model's own greedy continuations
    record = second[4]
    prompt = record["ids"][: record["prompt_length"]]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=127)
    assert record["ids"] == out[0].tolist()[: len(record["ids"])]


def test_trained_file_round_trips_with_metadata(tmp_path):
    model = tiny_llama()
    tokens = initial_prompt_tokens(model.get_input_embeddings().weight, [3], "tiny", 3, 2)
    tokens.training = {"trained": True, "samples": 100, "steps": 50, "final_loss": 2.5, "top1_acceptance": [0.3, 0.2, 0.1]}
    tokens.save(tmp_path / "t.safetensors")
    assert PromptTokens.load(tmp_path / "t.safetensors").training == tokens.training


@pytest.mark.slow
def test_ppd_train_end_to_end_and_resume(tmp_path, capsys):
    """`ppd train` on the real default model at toy scale: file, metadata, resumable work dir (its runs in this
    process: what they import is not the claim here)."""
    from app.cli import main
    from ppd_core.loading import load_model

    def ppd(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    questions = tmp_path / "eval.jsonl"
    questions.write_text("\n".join(json.dumps({"turns": [q]}) for q in ["Name a fruit.", "What is 2 + 2?"]) + "\n")
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(
        json.dumps({"messages": [{"role": "user", "content": q}]})
        for q in ["Tell me about cats.", "Write a haiku about rain.", "What is a CPU?", "Give me a pasta recipe."]
    ) + "\n")
    out = tmp_path / "trained.safetensors"
    command = ["train", "--samples", "4", "--epochs", "1", "--accumulate", "2",
               "--cuts", "4", "--max-new-tokens", "12", "--data", str(data), "--eval-questions", str(questions),
               "--eval-limit", "2", "--work-dir", str(tmp_path / "work"), "--out", str(out),
               "--backend", "llamacpp"]  # the acceptance pass's backend, whichever plain step is faster here
    code, stdout, stderr = ppd(*command, "--acceptance-prompts", "2")
    assert code == 0, stderr
    tokens = PromptTokens.load(out)
    assert tokens.embeddings.shape == (3, 2, 576)
    meta = tokens.training
    assert meta["trained"] and meta["samples"] == 4 and meta["steps"] == 2
    assert len(meta["top1_acceptance"]) == 3 and len(meta["top10_acceptance"]) == 3 and meta["eval_cuts"] > 0
    loaded = load_model("default", device="cpu")
    check_compatible(tokens, loaded.model.get_input_embeddings().weight, loaded.name)
    assert len(read_cache(tmp_path / "work" / "answers.jsonl")) == 4
    # the new tokens' acceptance, measured with the decoding backend and kept beside the file
    [record] = read_records(beside(out))
    assert record.key["prompt_tokens"] == tokens.fingerprint and record.key["prompts"] == 2
    assert record.key["backend"] == "llamacpp" and len(record.acceptance.trials) == 3 and record.lookup.positions > 0
    assert f"written to {beside(out)}" in stdout
    command += ["--acceptance-prompts", "0"]  # the runs below skip it
    # a second run finds the finished checkpoint and cached answers: same result
    code, _, stderr = ppd(*command)
    assert code == 0, stderr
    assert np.array_equal(PromptTokens.load(out).embeddings, tokens.embeddings)
    # distil the ensemble into one member per prompt token, starting from the trained file
    single = tmp_path / "single.safetensors"
    distil = command[: command.index("--work-dir")] + ["--work-dir", str(tmp_path / "work1"), "--out", str(single),
                                                       "--init", str(out), "--ensemble", "1", "--acceptance-prompts", "0"]
    code, _, stderr = ppd(*distil)
    assert code == 0, stderr
    distilled = PromptTokens.load(single)
    assert distilled.embeddings.shape == (3, 1, 576) and distilled.training["init"] == out.name  # never an absolute path
    assert distilled.training["init_training"]["steps"] == 2
    assert distilled.training["eval_questions"] == questions.name and distilled.training["data"] == data.name


def test_portable_names_in_training_metadata(tmp_path):
    from app.questions import DEFAULT_QUESTIONS
    from ppd_core.training.pipeline import portable_name

    assert portable_name(DEFAULT_QUESTIONS) == "app/data/mt_bench.jsonl"  # inside the package: relative to its root
    assert portable_name(tmp_path / "mine.jsonl") == "mine.jsonl"  # elsewhere: the file name only


def test_shipped_prompt_tokens_record_no_absolute_paths():
    """Shipped files name their questions, data and init files relative to the package, never by the training machine's paths."""
    from pathlib import Path, PurePosixPath, PureWindowsPath

    from ppd_core.engine_load import ASSETS

    def strings(value):
        if isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)
        elif isinstance(value, str):
            yield value

    shipped = sorted(Path(ASSETS).glob("*.safetensors"))
    assert len(shipped) >= 2
    for path in shipped:
        training = PromptTokens.load(path).training
        assert training["eval_questions"] == "app/data/mt_bench.jsonl"
        for text in strings(training):
            assert not PurePosixPath(text).is_absolute() and not PureWindowsPath(text).is_absolute(), (path.name, text)
            assert not text.startswith("~"), (path.name, text)
