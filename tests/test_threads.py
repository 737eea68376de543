"""One tokenizer, many threads: API workers encode chats while the model's worker decodes an answer.

llama.cpp's tokenizer (the default GGUF's) and a Hugging Face fast tokenizer (built here in memory with the ``tokenizers``
library: no Hub) are each used from many threads at once, with no lock, as ``ppd_core.text`` says they may be.
"""

import sys
import threading
import time

import pytest

from ppd_core import Engine, EngineConfig
from ppd_core.text import TextStream, chat_ids, text_stream

TEXTS = [
    "Name the capital city of France.",
    "Write a haiku about the sea, then explain it in two sentences.",
    "Ünïcödé, emoji 🙂🚀 and CJK 漢字 in one message: they must survive the round trip.",
    "List three prime numbers and say why each is prime. " * 6,
    "def add(a, b):\n    return a + b  # and a tab\there",
]
CONVERSATIONS = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}] for text in TEXTS]
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


def hammer(work, threads: int, rounds: int) -> tuple[list[BaseException], list[int], list[threading.Thread]]:
    """``work()`` ``rounds`` times on each of ``threads`` threads, started now: (errors, rounds done per thread, threads)."""
    errors: list[BaseException] = []
    done = [0] * threads

    def loop(index: int) -> None:
        try:
            for _ in range(rounds):
                work()
                done[index] += 1
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    return errors, done, workers


@pytest.mark.slow
def test_the_gguf_tokenizer_encodes_and_decodes_on_six_threads_while_an_answer_streams():
    engine = Engine.load(EngineConfig(model="default", device="cpu", tree="small", threads=1))
    try:
        tokenizer = engine.tokenizer
        expected_ids = [engine.chat_ids(c) for c in CONVERSATIONS]
        expected_text = [tokenizer.decode(ids, skip_special_tokens=True) for ids in expected_ids]
        alone = engine.generate(engine.chat_ids(STORY), "ppd", 32)

        def work():
            for conversation, ids, text in zip(CONVERSATIONS, expected_ids, expected_text):
                assert engine.chat_ids(conversation) == ids
                assert tokenizer.decode(ids, skip_special_tokens=True) == text
                stream = text_stream(tokenizer)
                assert stream.extend(ids) + stream.flush() == text

        errors, done, workers = hammer(work, 6, 40)
        final = None
        for final in engine.stream(engine.chat_ids(STORY), "ppd", 32):  # decoding and detokenizing on this thread
            pass
        during = list(done)
        for worker in workers:
            worker.join(120)
        assert not errors, errors[0]
        assert done == [40] * 6
        assert final.tokens == alone.tokens and final.text == alone.text
        assert min(during) >= 1, during  # every thread went through every conversation while the answer streamed
    finally:
        engine.close()


CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def fast_tokenizer():
    """A real byte-level BPE fast tokenizer, trained in memory, whose saved settings truncate (as some tokenizer.json
    files do): the first encodes turn that off, a change the Rust object refuses while another thread is inside it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(TEXTS * 20, trainer)
    backend.enable_truncation(max_length=100_000)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|im_end|>")
    tokenizer.chat_template = CHATML
    assert tokenizer.backend_tokenizer.truncation is not None
    return tokenizer


def run_together(jobs) -> list[BaseException]:
    """Each job on its own thread, all released at one moment; the errors they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(jobs))

    def run(job) -> None:
        try:
            start.wait(30)
            job()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=run, args=(job,), daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def test_a_hugging_face_fast_tokenizer_is_shared_by_encoding_and_decoding_threads():
    """Eight API workers encode a chat while the answering worker decodes, each round on a freshly made tokenizer whose
    first encodes turn its truncation off; and a settings change meets an encode in flight. tokenizers 0.20.3 raised
    "RuntimeError: Already borrowed" there; tokenizers 0.23, which transformers 5.23 requires, makes the change wait,
    so ppd shares one tokenizer with no lock of its own."""
    long_chat = [{"role": "user", "content": " ".join(TEXTS) * 40}]
    reference = fast_tokenizer()
    answer = reference.encode(" ".join(TEXTS) * 4, add_special_tokens=False)
    expected_chat, expected_answer = chat_ids(reference, long_chat), reference.decode(answer, skip_special_tokens=True)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change places as often as they can
    try:
        for _ in range(30):
            tokenizer, chats = fast_tokenizer(), []

            def encode():
                chats.append(chat_ids(tokenizer, long_chat))

            def decode():  # what the answering worker does, token by token
                for _ in range(3):
                    stream = TextStream(tokenizer)
                    assert stream.extend(answer) + stream.flush() == expected_answer

            errors = run_together([encode] * 8 + [decode] * 2)
            assert not errors, f"{type(errors[0]).__name__}: {errors[0]}"
            assert chats == [expected_chat] * 8
    finally:
        sys.setswitchinterval(previous)

    backend, text = reference.backend_tokenizer, " ".join(TEXTS) * 600  # an encode of about half a second here
    alone, encoded, inside = backend.encode(text).ids, [], threading.Event()

    def encode_long():
        inside.set()
        encoded.append(backend.encode_batch([text])[0].ids)

    worker = threading.Thread(target=encode_long)
    worker.start()
    assert inside.wait(30)
    time.sleep(0.05)  # inside the encode now
    backend.enable_truncation(max_length=100_000)  # what the first encode of a truncating tokenizer.json undoes
    backend.no_truncation()
    worker.join(60)
    assert encoded == [alone]
