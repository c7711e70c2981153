"""The trained presets' labelled data (issue 22) meets the shared line format, checked with no model.

The heads are fitted on `train` lines and measured on `heldout2` lines (held-out v2; the seen v1 `heldout` lines are
`train` lines now, marked `moved_from`) of `tools/decisions_eval/presets/*.jsonl`;
a malformed line, a lopsided answer mix, too little Chinese or a state shared by both splits would make the measured
accuracy meaningless, so the validator runs on the real folder, and on broken copies to show that it catches each fault.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VALIDATOR = ROOT / "tools" / "decisions_eval" / "check_presets.py"


def _load_validator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_presets", VALIDATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_presets"] = module  # dataclasses look the module up while the class body runs
    spec.loader.exec_module(module)
    return module


cp = _load_validator()


def _rows(preset: str) -> list[dict[str, Any]]:
    path = cp.PRESETS_DIR / f"{preset}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write(folder: Path, preset: str, rows: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    (folder / f"{preset}.jsonl").write_text(text, encoding="utf-8")


def test_all_seven_preset_files_exist_and_meet_the_format_counts_shares_and_balance() -> None:
    reports = cp.check_folder()
    assert [r.preset for r in reports] == list(cp.PRESETS)
    assert len(cp.PRESETS) == 7
    problems = [p for r in reports for p in r.problems]
    assert not problems, cp.table(reports) + "\n" + "\n".join(problems[:40])


def test_the_validator_reports_a_missing_preset_file_instead_of_skipping_it(tmp_path: Path) -> None:
    _write(tmp_path, "jailbreak", _rows("jailbreak"))
    reports = {r.preset: r for r in cp.check_folder(tmp_path)}
    assert reports["jailbreak"].problems == []
    assert any("missing" in p for p in reports["pii"].problems)
    assert cp.main(["check_presets.py", str(tmp_path)]) == 1


def _share_state(rows: list[dict[str, Any]]) -> None:
    held = next(r for r in rows if r["split"] == "heldout2")
    train = next(r for r in rows if r["split"] == "train")
    held["state"] = "  " + train["state"].upper() + " "  # case and spacing must not hide the leak


def _wrong_answer(rows: list[dict[str, Any]]) -> None:
    rows[0]["expected"] = "yes"


def _bad_id(rows: list[dict[str, Any]]) -> None:
    rows[0]["id"] = rows[0]["id"].replace("jailbreak-", "jb-")


def _too_little_chinese(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if r["split"] == "heldout2" and r["lang"] == "zh":
            r["lang"] = "en"
            r["id"] = r["id"].replace("jailbreak-zh-", "jailbreak-en-")


def _lopsided(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if r["split"] == "train" and r["expected"] is False:
            r["expected"] = True


def _drop_training_lines(rows: list[dict[str, Any]]) -> None:
    train = [i for i, r in enumerate(rows) if r["split"] == "train"]
    for i in reversed(train[cp.MIN_LINES["train"] - 1 :]):  # one line short of the minimum
        del rows[i]


def _no_hard_tags(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        r.pop("hard", None)


def _unknown_field(rows: list[dict[str, Any]]) -> None:
    rows[0]["label"] = True


def _duplicate_id(rows: list[dict[str, Any]]) -> None:
    rows[1]["id"] = rows[0]["id"]


def _moved_heldout_line_kept_heldout(rows: list[dict[str, Any]]) -> None:
    held = next(r for r in rows if r["split"] == "heldout2")
    held["moved_from"] = "heldout"  # only a train line may say it was a (seen) v1 held-out line


def _v1_split_name(rows: list[dict[str, Any]]) -> None:
    next(r for r in rows if r["split"] == "heldout2")["split"] = "heldout"  # v1's split is closed


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (_share_state, "in both train and heldout2"),
        (_wrong_answer, "is not valid for jailbreak"),
        (_bad_id, "is not 'jailbreak-"),
        (_too_little_chinese, "heldout2 is"),
        (_lopsided, "train answer False is 0%"),
        (_drop_training_lines, "train has"),
        (_no_hard_tags, "tagged hard"),
        (_unknown_field, "unknown field 'label'"),
        (_duplicate_id, "appears 2 times"),
        (_moved_heldout_line_kept_heldout, "moved_from is only for train lines"),
        (_v1_split_name, "split 'heldout' is not one of"),
    ],
)
def test_the_validator_catches_each_kind_of_broken_preset_data(
    tmp_path: Path, break_it: Callable[[list[dict[str, Any]]], None], message: str
) -> None:
    rows = _rows("jailbreak")
    break_it(rows)
    _write(tmp_path, "jailbreak", rows)
    report = cp.check_file(tmp_path / "jailbreak.jsonl", cp.PRESETS["jailbreak"])
    assert any(message in p for p in report.problems), report.problems


def test_a_heldout_pair_that_reuses_a_training_part_is_reported_as_a_leak(tmp_path: Path) -> None:
    rows = _rows("relevance")
    train = next(r for r in rows if r["split"] == "train")
    held = next(r for r in rows if r["split"] in cp.HELDOUT)
    held["state"] = {"request": held["state"]["request"], "candidate": train["state"]["candidate"]}
    _write(tmp_path, "relevance", rows)
    report = cp.check_file(tmp_path / "relevance.jsonl", cp.PRESETS["relevance"])
    assert any("part 'candidate'" in p and "also appears in train" in p for p in report.problems), report.problems


def test_a_preset_line_that_reuses_an_evaluation_item_text_is_reported(tmp_path: Path) -> None:
    presets = tmp_path / "presets"
    presets.mkdir()
    rows = _rows("jailbreak")
    _write(presets, "jailbreak", rows)
    item = {"id": "noul-x", "split": "heldout", "state": {"body": rows[5]["state"]}, "question": {}, "expected": True}
    (tmp_path / "items_zh.jsonl").write_text(json.dumps(item, ensure_ascii=False) + "\n", encoding="utf-8")
    reports = {r.preset: r for r in cp.check_folder(presets)}
    assert any("reuses the text of evaluation item noul-x" in p for p in reports["jailbreak"].problems)


def test_object_states_must_carry_the_parts_their_preset_names() -> None:
    spec = cp.PRESETS["grounded"]
    assert cp.check_line(spec, {}, "x")  # missing fields
    ok = {"context": "c", "answer": "a", "question": "q"}
    assert cp._check_state(spec, ok, "x") == []
    assert any("lacks parts" in p for p in cp._check_state(spec, {"context": "c"}, "x"))
    assert any("unknown parts" in p for p in cp._check_state(spec, {**ok, "extra": "e"}, "x"))
    assert any("non-empty string" in p for p in cp._check_state(cp.PRESETS["pii"], {"text": "t"}, "x"))
    assert cp._check_expected(cp.PRESETS["difficulty"], True, "x")  # a bool is not a level
    assert cp._check_expected(cp.PRESETS["difficulty"], 2, "x") == []


def test_the_held_out_v2_checksums_change_when_a_held_out_line_changes(tmp_path: Path) -> None:
    for preset in cp.PRESETS:
        _write(tmp_path, preset, _rows(preset))
    before = cp.split_sha256(tmp_path)
    rows = _rows("difficulty")
    held = next(r for r in rows if r["split"] == "heldout2")
    held["expected"] = (held["expected"] + 1) % 3  # another level
    _write(tmp_path, "difficulty", rows)
    after = cp.split_sha256(tmp_path)
    assert [p for p in cp.PRESETS if before[p] != after[p]] == ["difficulty"]
    rows = _rows("jailbreak")
    next(r for r in rows if r["split"] == "train")["why"] += " (edited)"
    _write(tmp_path, "jailbreak", rows)
    assert cp.split_sha256(tmp_path)["jailbreak"] == before["jailbreak"]  # train edits leave held-out sums alone


def test_a_preset_holds_lines_of_only_its_newest_held_out_split(tmp_path: Path) -> None:
    rows = _rows("difficulty")
    next(r for r in rows if r["split"] == "heldout2")["split"] = "heldout3"  # v3 written, v2 not moved to train
    _write(tmp_path, "difficulty", rows)
    report = cp.check_file(tmp_path / "difficulty.jsonl", cp.PRESETS["difficulty"])
    assert any("only the newest held-out split" in p for p in report.problems), report.problems


def test_seen_held_out_v2_lines_may_move_to_train_once_v3_measures_the_preset(tmp_path: Path) -> None:
    rows = _rows("jailbreak")
    held = [r for r in rows if r["split"] == "heldout2"]
    for r in held:  # v2 becomes training data, and (here) the same lines stand in for a fresh v3 part
        rows.append({**r, "id": r["id"] + "-v3", "split": "heldout3", "state": r["state"] + " (v3)"})
        r.update(split="train", moved_from="heldout2")
    _write(tmp_path, "jailbreak", rows)
    report = cp.check_file(tmp_path / "jailbreak.jsonl", cp.PRESETS["jailbreak"])
    assert report.problems == []
    assert len(report.split_lines("heldout3")) == len(held)
