"""pytest entry for the conformance scenarios: each scenario file is one test against a fresh fluxd."""
import json
import os
import re

import pytest

import run

SPEC = os.path.join(run.REPO, "protocol", "SPEC.md")
STEP_KINDS = {"connect", "hello", "send", "expect", "expect-closed", "quiet", "close", "signal"}


@pytest.mark.parametrize("path", run.scenario_files(), ids=lambda p: os.path.basename(p)[:-5])
def test_scenario(path):
    run.run_scenario(path)


# SPEC §11 codes no scenario expects, and why.
NOT_IN_SCENARIOS = {
    "disk-full": "needs the journal's disk to be full (SPEC §15.2), which a scenario cannot arrange: left to the "
                 "daemon's tests (the journal's storage seam can fail writes with ENOSPC)",
    "journal-failed": "needs a journal sync to fail (SPEC §15.2), which a scenario cannot arrange: left to the "
                      "daemon's tests (the journal's storage seam can fail syncs with EIO)",
    "disk-quota": "needs a durable fluxd (a journal, SPEC §15.2) and scenarios run fluxd --ephemeral: left to the "
                  "daemon's tests (DurabilityTests.diskQuota, SharedResourceTests.diskShare)",
    "not-retained": "expected by test_message_vectors.py (history and state-at, SPEC §8.12); a scenario would fail "
                    "every runner (Python, Node, Swift) until fluxd implements §8.12 in issue 15",
}


def spec_error_codes():
    """The codes of SPEC.md §11's table."""
    with open(SPEC, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## 11. Errors", 1)[1].split("\n## ", 1)[0]
    # Codes of the plugin host's operations (rows citing §8.11) need a fluxd started with a worker config; they
    # are exercised by Tests/IntegrationTests/SupervisorTests.swift, not by these config-less scenarios.
    return {code for code, rest in re.findall(r"^\| `([a-z-]+)` \|(.*)$", section, re.M) if "§8.11" not in rest}


def expected_codes():
    codes = set()

    def walk(value):
        if isinstance(value, dict):
            if value.get("op") == "error" or "code" in value and isinstance(value.get("code"), str):
                codes.add(value["code"])
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for path in run.scenario_files():
        with open(path, encoding="utf-8") as f:
            for step in json.load(f)["steps"]:
                if step["do"] == "expect":
                    walk(step["frame"])
    return codes


def test_every_error_code_of_the_spec_is_exercised():
    codes = spec_error_codes()
    assert len(codes) >= 16, codes
    assert set(NOT_IN_SCENARIOS) <= codes, sorted(set(NOT_IN_SCENARIOS) - codes)
    missing = codes - expected_codes() - set(NOT_IN_SCENARIOS)
    assert not missing, f"no scenario expects these SPEC §11 codes: {sorted(missing)}"


def test_scenarios_are_well_formed():
    for path in run.scenario_files():
        with open(path, encoding="utf-8") as f:
            scenario = json.load(f)
        assert scenario["name"] + ".json" == os.path.basename(path)
        assert scenario["description"]
        assert all(isinstance(a, str) for a in scenario.get("fluxd", []))
        for step in scenario["steps"]:
            assert step["do"] in STEP_KINDS, step
            if step["do"] == "send":
                assert sum(k in step for k in ("frame", "body", "hex")) == 1, step


def test_matcher_binds_and_compares_placeholders():
    bindings = {}
    assert run.match({"seq": "$s", "x": "$absent"}, {"seq": 4, "y": 1}, bindings) is None
    assert bindings == {"$s": 4}
    assert run.match({"seq": "$s"}, {"seq": 5}, bindings) is not None
    assert run.match({"v": True}, {"v": 1}, {}) is not None
    assert run.match({"v": "$$lit"}, {"v": "$lit"}, {}) is None
    assert run.match([1, 2], [1, 2, 3], {}) is not None
