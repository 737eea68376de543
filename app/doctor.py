"""`ppd doctor`: check ppd on this machine and write a report a user can paste into an issue.

Four parts: the environment (``probe_environment`` and what the loaded engine decodes with), greedy PPD against
plain decoding on the first MT-Bench questions (identical, or parting only at near-ties where the path is not
bitwise), the step latency against tree size (calibration's own measurement) and the tokens/s of those answers.
The report is ``DIR/doctor.json`` and ``DIR/doctor.md``; the verdict is the exactness check's.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from app.bench import ModeTotals, timed_answer
from ppd_core.atomic_files import atomic_write
from ppd_core import GREEDY, Engine
from ppd_core.engine_calibration import latency_curve, next_token_logits
from ppd_core.diagnostics import NEAR_TIE_LOGITS, AnswerComparison, compare_answer, probe_environment, verdict
from ppd_core.drafters.lookup import chains_text
from ppd_core.errors import PpdError

CPU_SIZES = (1, 2, 4, 8, 16)  # a short curve: each CPU row costs most of a step, larger trees never win there
GPU_SIZES = (1, 2, 4, 8, 16, 32, 64)
CONTEXT = 256  # cached tokens before each timed step, as in calibration
WARMUP = "Say hello."


@dataclass
class DoctorConfig:
    prompts: int = 5
    max_new_tokens: int = 128
    command: str = "ppd doctor"


def on_gpu(engine: Engine) -> bool:
    """Whether steps run on a GPU: a CUDA torch device, or llama.cpp layers offloaded."""
    return engine.loaded.info.on_gpu


def engine_json(engine: Engine) -> dict:
    loaded, info = engine.loaded, engine.loaded.info
    return {"model": loaded.name, "backend": info.name, "forward": info.forward, "quant": loaded.quant,
            "dtype": info.dtype, "torch_device": info.device,
            "gpu_layers": info.kernels.get("gpu_layers"), "threads": info.threads, "kernels": info.kernels,
            "bitwise": info.bitwise, "exactness": engine.snapshot().exactness, "tree": engine.snapshot().tree,
            "calibrated": engine.plan.profile is not None, "calibration": engine.plan.expectation}


def check_answers(engine: Engine, questions: list[str], max_new_tokens: int,
                  log=None) -> tuple[list[AnswerComparison], dict[str, ModeTotals]]:
    """Greedy plain and PPD answers to each question (from an empty cache; which goes first alternates), compared.
    Progress lines go to ``log`` (default: stderr)."""
    log = log or sys.stderr
    warmup = engine.chat_ids([{"role": "user", "content": WARMUP}])
    for mode in ("plain", "ppd"):
        engine.generate(warmup, mode, 8)
    totals = {"plain": ModeTotals(), "ppd": ModeTotals()}
    comparisons = []
    for number, question in enumerate(questions):
        ids = engine.chat_ids([{"role": "user", "content": question}])
        answers = {}
        for mode in ("plain", "ppd") if number % 2 == 0 else ("ppd", "plain"):
            engine.forget_conversation()  # each answer processes its prompt: the second would reuse the first's
            answers[mode] = timed_answer(engine, ids, mode, max_new_tokens, [totals[mode]], GREEDY)
        engine.forget_conversation()
        comparisons.append(compare_answer(number, ids, answers["plain"], answers["ppd"], lambda ids: next_token_logits(engine, ids)))
        same = "identical" if comparisons[-1].identical else f"part at token {comparisons[-1].difference.index}"
        print(f"ppd doctor: [{number + 1}/{len(questions)}] answers {same}", file=log, flush=True)
    return comparisons, totals


def latency_json(curve: dict[int, dict[int, float]]) -> dict:
    """The one context's curve: ms per tree size and each size's cost in one-token steps."""
    context, by_size = next(iter(curve.items()))
    base = by_size[min(by_size)]
    return {"context": context, "ms": {str(size): ms for size, ms in sorted(by_size.items())},
            "ratio": {str(size): round(ms / base, 3) for size, ms in sorted(by_size.items())}}


def notes_of(engine: Engine, environment) -> list[str]:
    notes = []
    if environment.gpu is not None and not on_gpu(engine):
        notes.append(f"CUDA is available ({environment.gpu['name']}) but the model runs on the CPU")
    if environment.llama_cpp.get("error"):
        notes.append(environment.llama_cpp["error"])
    if engine.plan.profile is None:
        notes.append(f"PPD decoded with the static tree {engine.plan.family.name}, not one calibrated for this device "
                     "(--tree auto calibrates)")
    return notes


def ppd_version() -> str:
    """The installed package's version; "not installed" when ppd runs from a source folder on the path (the report
    is still written: on the H200 that missing name ended the doctor after all its checks)."""
    try:
        return importlib.metadata.version("ppd")
    except importlib.metadata.PackageNotFoundError:
        return "not installed (run from source)"


def run_doctor(engine: Engine, questions: list[str], config: DoctorConfig, log=None) -> dict:
    """Every check on ``engine``; the report object (``doctor.json``). Progress lines go to ``log`` (default: stderr)."""
    log = log or sys.stderr
    environment = probe_environment(engine.loaded.info.properties, engine.loaded.info.read_memory)
    comparisons, totals = check_answers(engine, questions, config.max_new_tokens, log)
    bitwise = engine.loaded.info.bitwise
    result = verdict(comparisons, bitwise)
    print("ppd doctor: timing steps against tree size", file=log, flush=True)
    curve = latency_curve(engine, GPU_SIZES if on_gpu(engine) else CPU_SIZES, contexts=(CONTEXT,))
    plain, ppd = totals["plain"].to_json(True), totals["ppd"].to_json(True)
    return {
        "ppd_version": ppd_version(),
        "command": config.command,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "verdict": "PASS" if result.passed else "FAIL",
        "reasons": result.reasons,
        "environment": environment.to_json(),
        "engine": engine_json(engine),
        "notes": notes_of(engine, environment),
        "exactness": {
            "prompts": len(questions), "max_new_tokens": config.max_new_tokens, "bitwise": bitwise,
            "near_tie_logits": NEAR_TIE_LOGITS,
            "identical": sum(c.identical for c in comparisons),
            "answers": [{**asdict(c), "identical": c.identical} for c in comparisons],
            "passed": result.passed,
        },
        "latency": latency_json(curve),
        "bench": {"plain": plain, "ppd": ppd,
                  "speedup": round(ppd["tok_s"] / plain["tok_s"], 4) if plain["tok_s"] else 0.0},
    }


def gib(count: int) -> str:
    return f"{count / 2**30:.1f} GiB"


def tokens(count: int) -> str:
    return f"{count} token" + ("" if count == 1 else "s")


def token_text(engine_tokenizer, token: int | None) -> str:
    return "(end)" if token is None else f"{token} {engine_tokenizer.decode([token])!r}"


def environment_lines(report: dict) -> list[str]:
    env, eng = report["environment"], report["engine"]
    device, llama = env["device"], env["llama_cpp"]
    capability = f", compute capability {device['compute_capability']}" if device["compute_capability"] else ""
    integrated = ", integrated (unified memory)" if device["integrated"] else ""
    memory = env["memory"] if isinstance(env["memory"], str) else (
        f"{env['memory']['label']} {gib(env['memory']['used_bytes'])} used of {gib(env['memory']['total_bytes'])}")
    if llama["version"] is None:
        llama_line = "llama-cpp-python: not usable here"
    else:
        offload = "yes" if llama["gpu_offload"] else "no"
        llama_line = f"llama-cpp-python {llama['version']} (GPU offload: {offload}); system info: `{llama['system_info']}`"
    gpu_layers = f", {eng['gpu_layers']} GPU layers" if eng["gpu_layers"] is not None else ""
    chains = eng["tree"]["lookup_chain_by_match_length"]
    lookup = f"; lookup {chains_text(chains)}" if any(chains) else "; no lookup chains"
    if eng["tree"].get("lookup_policy") == "adaptive":
        lookup = f"; lookup chains learnt per conversation, starting from calibration's {chains_text(chains)}"
    lines = [
        f"ppd {report['ppd_version']}; Python {env['python']}; {env['os']} ({env['arch']})",
        f"torch {env['torch']} (" + (f"CUDA {env['torch_cuda']}, cuDNN {env['cudnn']}" if env["torch_cuda"] else
                                     "a CPU build: no CUDA") + f"); CUDA available: {'yes' if env['cuda_available'] else 'no'}",
        f"device: {device['name']} ({device['kind']}{capability}{integrated}, {gib(device['total_memory_bytes'])})",
        f"dtype: {env['compute_dtype']} (native bf16: {'yes' if env['native_bf16'] else 'no'}); attention: {env['attention']}",
        f"memory ({env['memory_source']}): {memory}",
        f"transformers {env['transformers']}; bitsandbytes {env['bitsandbytes']}",
        llama_line,
        f"decodes with: {eng['backend']} ({eng['forward']} forward, {eng['quant']}, {eng['dtype']}{gpu_layers}, "
        f"{eng['threads']} threads); tree {eng['tree']['name']} ({tokens(eng['tree']['tokens_per_step'])} per step){lookup}",
        f"steps: {eng['tree'].get('step_policy', 'each its own shape')}",
        f"exactness: {eng['exactness']}",
    ]
    if env["gpu"]:
        lines.append(f"GPU: {env['gpu']['name']} (compute capability {env['gpu']['compute_capability']})")
    return lines + [f"version note: {note}" for note in env["version_notes"]] + [f"note: {n}" for n in report["notes"]]


def markdown(report: dict, tokenizer) -> str:
    """The summary for a GitHub issue."""
    exact, latency, bench = report["exactness"], report["latency"], report["bench"]
    rule = ("bitwise path: every answer must be identical" if exact["bitwise"] else
            f"not bitwise: answers may part only at near-ties, PPD's token within {exact['near_tie_logits']} logits")
    out = [f"## ppd doctor: {report['verdict']}", "", f"`{report['command']}` ({report['timestamp']})", "",
           "**Environment**", ""]
    out += [f"- {line}" for line in environment_lines(report)]
    out += ["", f"**Exactness:** {exact['identical']}/{exact['prompts']} identical ({exact['max_new_tokens']} new "
            f"tokens each; {rule})"]
    differing = [a for a in exact["answers"] if a["difference"]]
    if differing:
        out += ["", "| prompt | first difference | plain token | PPD token | top-2 gap | PPD token's margin |",
                "|---|---|---|---|---|---|"]
        for answer in differing:
            d = answer["difference"]
            out.append(f"| {answer['prompt']} | {d['index']} | {token_text(tokenizer, d['plain_token'])} | "
                       f"{token_text(tokenizer, d['ppd_token'])} | {d['top2_gap']:.3f} | {d['ppd_margin']:.3f} |")
    out += ["", f"**Step latency** (after {latency['context']} cached tokens)", "", "| tree tokens | ms | t(T)/t(1) |",
            "|---|---|---|"]
    out += [f"| {size} | {ms:.2f} | {latency['ratio'][size]:.2f} |" for size, ms in latency["ms"].items()]
    plain, ppd, tree = bench["plain"], bench["ppd"], report["engine"]["tree"]
    how = "calibrated for this device" if report["engine"]["calibrated"] else "static"
    out += ["", f"**Bench:** plain {plain['tok_s']:.1f} tokens/s, PPD {ppd['tok_s']:.1f} tokens/s: "
            f"{bench['speedup']:.2f}x, {ppd['mean_accepted']:.2f} tokens/step ({exact['prompts']} answers of up to "
            f"{exact['max_new_tokens']} tokens; tree {tree['name']}, {tokens(tree['tokens_per_step'])}, {how})", ""]
    out += [f"**{report['verdict']}**"] + [f"- {reason}" for reason in report["reasons"]]
    return "\n".join(out) + "\n"


def check_out(out: Path) -> None:
    """Fail before the model loads if the report folder cannot be one."""
    if out.exists() and not out.is_dir():
        raise PpdError(f"--out {out} is a file, not a folder")


def write_report(report: dict, summary: str, out: Path) -> tuple[Path, Path]:
    """``doctor.json`` and ``doctor.md`` in ``out``, each written atomically."""
    try:
        return (atomic_write(out / "doctor.json", json.dumps(report, indent=2) + "\n"),
                atomic_write(out / "doctor.md", summary))
    except OSError as error:
        raise PpdError(f"cannot write the report to {out}: {error.strerror or error}") from None
