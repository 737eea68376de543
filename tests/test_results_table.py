"""The measurement log's bench table (benchmarks/README.md) is the one generated from the bench JSON files, and the
front page carries no generated table."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_generator():
    spec = importlib.util.spec_from_file_location("results_table", ROOT / "benchmarks" / "scripts" / "results_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_logs_table_is_generated_from_the_json_files():
    generator = load_generator()
    log = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    generated = generator.table()
    assert generated.count("\n") == 1 + len(list(generator.FOLDER.glob("*.json")))  # a header, a rule, a row a file
    assert generator.readme_with_table(log, generated) == log, "run: python benchmarks/scripts/results_table.py --write"


def test_the_front_page_has_no_generated_table():
    assert "results-table:start" not in (ROOT / "README.md").read_text(encoding="utf-8")


def test_table_rows_follow_the_json(tmp_path):
    generator = load_generator()
    result = {"device": {"name": "Some CPU", "threads": 4}, "forward": "lean", "quant": "int4", "dtype": "float32",
              "prompt_tokens": {"trained": True, "config": {"ensemble_size": 1}}, "tree": {"name": "budget-4", "tokens_per_step": 4},
              "sampling": {"temperature": 0.0}, "vanilla": {"tok_s": 40.0, "peak_mem_mb": 500.0},
              "ppd": {"tok_s": 52.0, "mean_accepted": 1.3, "peak_mem_mb": 510.0}, "speedup": 1.3, "identical": True,
              "transformers_generate": {"tok_s": 13.0}, "calibration": {"expected_tokens_per_step": 1.25}}
    (tmp_path / "run.json").write_text(__import__("json").dumps(result))
    (tmp_path / "other.json").write_text('{"app_tok_s": 1}')  # not a bench result: left out
    lines = generator.table(tmp_path).splitlines()
    assert len(lines) == 3
    assert lines[2] == ("| `run.json` | Some CPU, 4 threads | lean | int4 (float32) | trained, V=1 | budget-4 (4 tokens) | ? x 1 turn | "
                        "greedy | 40.00 | 52.00 | **1.30x** | 1.300 (1.250) | yes | 13.00 | 510 |")
    # with lookup chains, two turns of one category: the lookup prediction, the questions and their category
    result.update(questions=10, turns=2, groups={"turn 1": {}, "turn 2": {}, "coding": {}})
    result["tree"]["lookup_chain_by_match_length"] = [0, 3, 3, 3]
    result["calibration"]["expected_tokens_per_step_with_lookup"] = 1.5
    (tmp_path / "run.json").write_text(__import__("json").dumps(result))
    line = generator.table(tmp_path).splitlines()[2]
    assert "| budget-4 (4 tokens) + lookup 0/3/3/3 | 10 x 2 turns (coding) |" in line and "| 1.300 (1.500) |" in line
    # a file from before the mode's rename keeps its plain figures under "vanilla": the same row either way
    result["plain"] = result.pop("vanilla")
    (tmp_path / "run.json").write_text(__import__("json").dumps(result))
    assert generator.table(tmp_path).splitlines()[2] == line
