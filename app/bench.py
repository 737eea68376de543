"""`ppd bench`: plain decoding against PPD on the same questions, interleaved in one process."""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from app.bench_depths import add_counts, depth_table, json_name, per_step_by_depth
from app.questions import Question
from app.server_peer import ServerPeer
from ppd_core import GREEDY, Engine, Mode, SamplingParams
from ppd_core.backends.llamacpp.library import chat_model
from ppd_core.device_info import describe
from ppd_core.errors import PpdError


class PeakMemory:
    """Peak memory over a block: the CUDA allocator's peak, or the process's peak resident set.

    On Linux the kernel's peak-RSS counter (VmHWM) is reset by writing 5 to
    /proc/self/clear_refs, so nothing has to poll (a polling thread would slow the decode loop).
    """

    def __init__(self, device: Any = "cpu"):
        self.device = device  # "cpu", or a torch device
        self.cuda = getattr(device, "type", device) == "cuda"
        self.peak = 0

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            import torch  # noqa: PLC0415 - the torch backend's GPU allocator

            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass  # not Linux: the peak then covers the whole process lifetime
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            import torch  # noqa: PLC0415

            self.peak = torch.cuda.max_memory_allocated(self.device)
            return
        try:
            status = Path("/proc/self/status").read_text()
            self.peak = int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1]) * 1024
        except (OSError, StopIteration):
            self.peak = psutil.Process().memory_info().rss


@dataclass
class ModeTotals:
    new_tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    decode_tokens: int = 0
    accepted: dict[str, int] = field(default_factory=dict)  # accepted guesses by source (a drafter's name)
    drafted: dict[str, int] = field(default_factory=dict)  # tree nodes each source owned
    accepted_by_depth: dict[tuple[str, int], int] = field(default_factory=dict)  # (source, depth 1..) -> accepted
    peak_bytes: int = 0
    answers: list[list[int]] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return round(self.new_tokens / self.seconds, 3) if self.seconds else 0.0

    def to_json(self, with_steps: bool) -> dict:
        out = {
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 3),
            "tok_s": self.tok_s,
            "peak_mem_mb": round(self.peak_bytes / 2**20, 1),
        }
        if with_steps:
            out["steps"] = self.steps
            out["mean_accepted"] = round(self.decode_tokens / self.steps, 4) if self.steps else 0.0
            names = list(dict.fromkeys([*self.drafted, *self.accepted]))
            for key, counts in (("accepted_per_step_by_source", self.accepted),
                                ("drafted_per_step_by_source", self.drafted)):
                out[key] = {json_name(name): round(counts.get(name, 0) / self.steps, 4) if self.steps else 0.0
                            for name in names}
            out["accepted_per_step_by_depth"] = per_step_by_depth(self.accepted_by_depth, names, self.steps)
        return out


@dataclass
class BenchConfig:
    turns: int = 1  # 1: first turns only; 2: also the follow-up, after the first answer
    max_new_tokens: int = 128
    compare_generate: bool = False  # also time transformers generate() (greedy only)
    compare_llama_cpp: bool = False  # also time llama-cpp-python's create_chat_completion (greedy only)
    sampling: SamplingParams = GREEDY
    llama_server: Path | None = None  # also time this llama-server binary, plain and with its n-gram drafts (greedy only)
    server_specs: tuple[str, ...] = ("plain", "ngram-simple", "ngram-mod")


@dataclass
class BenchRun:
    """Running totals of one benchmark."""

    modes: dict[str, ModeTotals] = field(default_factory=lambda: {"plain": ModeTotals(), "ppd": ModeTotals()})
    groups: dict[str, dict[str, ModeTotals]] = field(default_factory=dict)  # "turn 2", "coding", ...: the same per group
    reference: ModeTotals = field(default_factory=ModeTotals)  # transformers generate()
    peer: ModeTotals = field(default_factory=ModeTotals)  # llama-cpp-python create_chat_completion
    peer_same_text: int = 0  # its answers whose text equals plain decoding's
    servers: dict[str, dict[str, ModeTotals]] = field(default_factory=dict)  # llama-server's, by spec: "all", "turn N"
    server_same_text: dict[str, int] = field(default_factory=dict)  # its answers whose text equals plain decoding's
    mismatches: list[int] = field(default_factory=list)  # questions whose greedy answers differ


def timed_answer(engine: Engine, ids: list[int], mode: Mode, max_new_tokens: int, totals: list[ModeTotals], sampling: SamplingParams) -> list[int]:
    """One answer, counted into each of ``totals`` (the run's, its turn's, its category's)."""
    request = engine.check(ids, max_new_tokens, mode=mode, sampling=sampling, reuse_cache=True)
    with PeakMemory(engine.loaded.device) as memory:
        result = engine.generate(request)
    stats = result.stats
    for total in totals:
        total.new_tokens += stats.new_tokens
        total.seconds += stats.seconds
        total.steps += stats.steps
        total.decode_tokens += sum(stats.accepted_per_step)
        add_counts(total, stats)
        total.peak_bytes = max(total.peak_bytes, memory.peak)
    totals[0].answers.append(result.tokens)
    return result.tokens


def timed_reference(engine: Engine, ids: list[int], max_new_tokens: int, totals: ModeTotals) -> None:
    """transformers' own greedy decoding of a Hugging Face model, timed (torch loads here, on request only)."""
    from ppd_core.training.greedy import reference_answer  # noqa: PLC0415

    with PeakMemory(engine.loaded.device) as memory:
        start = time.perf_counter()
        tokens = reference_answer(engine.loaded, ids, max_new_tokens)
        totals.seconds += time.perf_counter() - start
    totals.new_tokens += len(tokens)
    totals.peak_bytes = max(totals.peak_bytes, memory.peak)


class LlamaCppPeer:
    """llama-cpp-python's own chat API on the same GGUF file and threads: what its users run."""

    def __init__(self, engine: Engine, sampling: SamplingParams):
        self.sampling = sampling  # its penalties (greedy either way)
        gguf = engine.loaded.gguf_file
        if gguf is None:
            raise PpdError("--compare-llama-cpp needs a GGUF model (the default is one)")
        self.threads = engine.threads
        try:
            # ``Any``: llama-cpp-python's stubs type a whole answer and a streamed one alike
            self.llama: Any = chat_model(gguf, n_ctx=4096, n_threads=self.threads, n_threads_batch=self.threads,
                                         verbose=False,
                                         last_n_tokens_size=4096 if sampling.repeat_last_n < 0 else sampling.repeat_last_n)
        except PpdError as error:
            raise PpdError(f"--compare-llama-cpp: {error}") from None

    def answer(self, messages: list[dict], max_new_tokens: int, totals: ModeTotals) -> str:
        with PeakMemory("cpu") as memory:
            start = time.perf_counter()
            response = self.llama.create_chat_completion(
                messages, max_tokens=max_new_tokens, temperature=0.0, top_k=1, repeat_penalty=self.sampling.repeat_penalty,
                presence_penalty=self.sampling.presence_penalty, frequency_penalty=self.sampling.frequency_penalty)
            totals.seconds += time.perf_counter() - start
        totals.new_tokens += response["usage"]["completion_tokens"]
        totals.peak_bytes = max(totals.peak_bytes, memory.peak)
        return response["choices"][0]["message"]["content"] or ""

    def conversation(self, turns: list[str], max_new_tokens: int, totals: ModeTotals) -> list[str]:
        """Its answers to each turn, following its own: the first from an empty cache, later turns reusing the
        conversation's (``Llama`` keeps the longest common prefix of its last call), as ppd's modes do."""
        self.llama.reset()
        history, answers = [], []
        for turn in turns:
            history.append({"role": "user", "content": turn})
            answers.append(self.answer(history, max_new_tokens, totals))
            history.append({"role": "assistant", "content": answers[-1]})
        return answers

    def describe(self) -> dict:
        return {"api": "llama_cpp.Llama.create_chat_completion", "temperature": 0.0, "threads": self.threads,
                "n_ctx": 4096, "flash_attention": False, "kv_cache": "f16",  # the library's defaults
                "llama_cpp_python": __import__("llama_cpp").__version__}


def bench_question(engine: Engine, number: int, question: Question, config: BenchConfig, run: BenchRun,
                   peer: LlamaCppPeer | None = None, servers: dict[str, ServerPeer] | None = None) -> None:
    """Each mode answers the whole conversation as the chat does: the first turn from an empty cache (its
    prompt processed whole), later turns after the mode's own answers, reusing the conversation's cache.
    Which mode goes first alternates between questions; the llama-servers answer after ppd on even questions,
    before it on odd ones."""
    servers = servers or {}
    server_answers = {} if number % 2 == 0 else server_conversations(servers, question, config, run)
    sampling = config.sampling
    if not sampling.greedy:  # both modes get the same seed per question
        sampling = dataclasses.replace(sampling, seed=(sampling.seed or 0) + number)
    turns = question.turns[: config.turns]
    order = ("plain", "ppd") if number % 2 == 0 else ("ppd", "plain")
    answers: dict[str, list[list[int]]] = {}
    for mode in order:
        engine.forget_conversation()
        history: list[dict] = []
        answers[mode] = []
        for index, turn in enumerate(turns, 1):
            history.append({"role": "user", "content": turn})
            groups = [run.groups.setdefault(name, {"plain": ModeTotals(), "ppd": ModeTotals()}) for name in (f"turn {index}", question.category)]
            ids = engine.chat_ids(history)
            tokens = timed_answer(engine, ids, mode, config.max_new_tokens, [run.modes[mode]] + [g[mode] for g in groups], sampling)
            if mode == "plain" and config.compare_generate and sampling.greedy:  # the same prompt, no cache reuse
                timed_reference(engine, ids, config.max_new_tokens, run.reference)
            answers[mode].append(tokens)
            history.append({"role": "assistant", "content": engine.tokenizer.decode(tokens, skip_special_tokens=True)})
    engine.forget_conversation()
    if number % 2 == 0:
        server_answers = server_conversations(servers, question, config, run)
    plain = [engine.tokenizer.decode(tokens, skip_special_tokens=True).strip() for tokens in answers["plain"]]
    for spec, texts in server_answers.items():
        run.server_same_text[spec] = run.server_same_text.get(spec, 0) + sum(a.strip() == b for a, b in zip(texts, plain))
    if peer is not None and sampling.greedy:
        run.peer_same_text += sum(a.strip() == b for a, b in zip(peer.conversation(turns, config.max_new_tokens, run.peer), plain))
    if answers["ppd"] != answers["plain"]:
        run.mismatches.append(number)


def server_conversations(servers: dict[str, ServerPeer], question: Question, config: BenchConfig,
                         run: BenchRun) -> dict[str, list[str]]:
    """Each llama-server's answers to the question's turns, counted into its totals (all turns, and per turn)."""
    texts = {}
    for spec, server in servers.items():
        totals = run.servers.setdefault(spec, {})
        answers = server.conversation(question.turns[: config.turns], config.max_new_tokens)
        for index, (_, tokens, seconds) in enumerate(answers, 1):
            for name in ("all", f"turn {index}"):
                totals.setdefault(name, ModeTotals()).new_tokens += tokens
                totals[name].seconds += seconds
        texts[spec] = [text for text, _, _ in answers]
    return texts


def start_servers(engine: Engine, config: BenchConfig) -> dict[str, ServerPeer]:
    """The llama-servers of ``config`` on the engine's GGUF file and threads, each warmed up on one answer."""
    if config.llama_server is None:
        return {}
    gguf = engine.loaded.gguf_file
    if gguf is None:
        raise PpdError("--compare-llama-server needs a GGUF model (the default is one)")
    if not config.sampling.greedy:
        raise PpdError("--compare-llama-server compares greedy answers: leave --temperature at 0")
    servers: dict[str, ServerPeer] = {}
    try:
        for spec in config.server_specs:
            servers[spec] = ServerPeer(config.llama_server, gguf, engine.threads, spec, config.sampling)
            servers[spec].answer([{"role": "user", "content": "Say hello."}], 16)  # its warm-up
    except BaseException:
        for server in servers.values():
            server.close()
        raise
    return servers


def run_benchmark(engine: Engine, questions: list[Question], config: BenchConfig, log=None) -> dict:
    """Answers both ways for every question (order alternating), then the JSON summary.

    Greedy by default: the answers must then be identical. When sampling, both modes get
    the same seed per question, and ``identical`` is null (samples differ by design).
    Progress lines go to ``log`` (the stderr of the moment when None).
    """
    log = log or sys.stderr
    sampling = config.sampling
    print("repetition penalties " + (f"on (repeat {sampling.repeat_penalty} over {sampling.repeat_last_n} tokens, presence "
                                     f"{sampling.presence_penalty}, frequency {sampling.frequency_penalty}): they "
                                     "hold back the copying lookup guesses rely on" if sampling.penalized else
                                     "off (--repeat-penalty and the others turn them on)"), file=log, flush=True)
    warmup = engine.chat_ids([{"role": "user", "content": "Say hello."}])
    for mode in ("plain", "ppd"):
        engine.generate(warmup, mode, 16)
    run = BenchRun()
    peer = LlamaCppPeer(engine, sampling) if config.compare_llama_cpp else None
    if peer is not None:
        peer.answer([{"role": "user", "content": "Say hello."}], 16, ModeTotals())  # its warm-up
    servers = start_servers(engine, config)
    try:
        for number, question in enumerate(questions):
            bench_question(engine, number, question, config, run, peer, servers)
            speeds = {mode: t.new_tokens / max(t.seconds, 1e-9) for mode, t in run.modes.items()}
            line = f"[{number + 1}/{len(questions)}] ppd {speeds['ppd']:.1f} tok/s, plain {speeds['plain']:.1f} tok/s"
            if peer is not None:
                line += f", llama.cpp create_chat_completion {run.peer.tok_s:.1f} tok/s"
            line += "".join(f", llama-server {spec} {run.servers[spec]['all'].tok_s:.1f} tok/s" for spec in servers)
            print(line, file=log, flush=True)
    finally:
        for server in servers.values():
            server.close()
    result = summary(engine, len(questions), config, run)
    print(depth_table(result), file=log, flush=True)
    if servers:
        result["llama_server"] = server_summary(engine, servers, run, result)
    if peer is not None:
        result["llama_cpp"] = {**run.peer.to_json(False), **peer.describe(), "same_text_as_plain": run.peer_same_text,
                               "plain_over_llama_cpp": round(result["plain"]["tok_s"] / run.peer.tok_s, 4) if run.peer.tok_s else 0.0,
                               "ppd_over_llama_cpp": round(result["ppd"]["tok_s"] / run.peer.tok_s, 4) if run.peer.tok_s else 0.0}
    return result


def server_summary(engine: Engine, servers: dict[str, ServerPeer], run: BenchRun, result: dict) -> dict:
    """Each llama-server's tokens/s, all turns and per turn, and ppd's (plain and PPD) over it on the same parts."""
    gguf = engine.loaded.gguf_file
    assert gguf is not None  # llama-servers run on a GGUF only (``start_servers``)
    ours = {"all": {mode: result[mode]["tok_s"] for mode in ("plain", "ppd")}}
    for name, group in result["groups"].items():
        if name.startswith("turn "):
            ours[name] = {"plain": group["plain_tok_s"], "ppd": group["ppd"]["tok_s"]}
    out = {}
    for spec, server in servers.items():
        totals = run.servers[spec]
        out[spec] = {
            **{key: value for key, value in totals["all"].to_json(False).items() if key != "peak_mem_mb"},
            **server.describe(gguf),
            "same_text_as_plain": run.server_same_text.get(spec, 0),
            "by_part": {part: {"tok_s": totals[part].tok_s,
                               **{f"{mode}_over_it": round(ours[part][mode] / totals[part].tok_s, 4) if totals[part].tok_s else 0.0
                                  for mode in ("plain", "ppd")}}
                        for part in ours if part in totals},
        }
    return out


def summary(engine: Engine, num_questions: int, config: BenchConfig, run: BenchRun) -> dict:
    """The ``ppd bench --json`` object (names fixed: other tools read them)."""
    greedy = config.sampling.greedy
    plain, ppd = run.modes["plain"].to_json(False), run.modes["ppd"].to_json(True)
    result = {
        "model": engine.loaded.name,
        "device": describe(engine.loaded.info.properties).to_json(),
        "quant": engine.loaded.quant,
        "dtype": engine.loaded.info.dtype,
        "backend": engine.loaded.info.name,
        "forward": engine.loaded.forward,
        "kernels": engine.loaded.kernels,
        "questions": num_questions,
        "turns": config.turns,
        "max_new_tokens": config.max_new_tokens,
        "tree": engine.snapshot().tree,
        "prompt_tokens": engine.prompt_tokens.training,
        "plain": plain,
        "ppd": ppd,
        "speedup": round(ppd["tok_s"] / plain["tok_s"], 4) if plain["tok_s"] else 0.0,
        "identical": not run.mismatches if greedy else None,
        "mismatches": run.mismatches if greedy else [],
        "sampling": config.sampling.describe(),
        "memory_overhead_bytes": engine.snapshot().overhead_bytes,
    }
    expectation = engine.plan.expectation
    if expectation is not None:  # what calibration expects of the tree in use
        result["calibration"] = expectation
    if config.compare_generate:
        result["transformers_generate"] = run.reference.to_json(False)
    result["groups"] = {  # by turn and by category: the same measures on each part of the run
        name: {"plain_tok_s": totals["plain"].tok_s, "ppd": totals["ppd"].to_json(True),
               "speedup": round(totals["ppd"].tok_s / totals["plain"].tok_s, 4) if totals["plain"].tok_s else 0.0}
        for name, totals in sorted(run.groups.items())
    }
    return result


def plot_result(result: dict, path: Path) -> None:
    """Bar chart of tokens/s per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ["plain", "ppd"] + (["transformers_generate"] if "transformers_generate" in result else [])
    values = [result[m]["tok_s"] for m in modes]
    figure, axis = plt.subplots(figsize=(5, 3))
    axis.bar(modes, values, color=["#888", "#2a7", "#57c"][: len(modes)])
    axis.set_ylabel("tokens / s")
    axis.set_title(f"{result['model']} on {result['device']['name'][:40]}\nspeedup {result['speedup']:.2f}x", fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
