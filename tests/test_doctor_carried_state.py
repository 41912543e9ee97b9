"""The doctor on state carried across steps: the chain of the program's lines, and the fix where the state is made.

Each program in tests/doctor_cases/carried_state/ marks the backward that freed the graph and failed
(``# doctor: freed failed``), the line that first used the stale tensor (``carried``), the call in the
loop that passed it into another function (``passed``) and the statement that kept it without
detaching (``produced``). The report must name exactly those lines, propose ``.detach()`` (never
``retain_graph=True``) as the change below, and the program with that change applied must run clean.
"""

from __future__ import annotations

import re

import pytest
from doctor_corpus import assert_error_report, corpus, lines_by_role, runs_fixture

MARK = re.compile(r"#\s*doctor:\s*(\w+(?:\s+\w+)*)\s*$")
ROLES = {"freed": "freed by", "carried": "carried by", "passed": "passed at", "produced": "produced at",
         "failed": "failed at"}
CORPUS = corpus("carried_state")
FOLDER, CASES, FAILING, _ = CORPUS
runs = runs_fixture(CORPUS)
FIXES = {
    "actor_critic_lstm_policy.py": (
        "passed", "logits, value, state = policy(observation, tuple(part.detach() for part in state))"
    ),
    "feature_cache_dict.py": ("produced", "feature_cache[index] = backbone(images[index]).detach()"),
    "gan_image_pool.py": ("carried", "scores = discriminator(torch.cat([torch.randn(8, 16), history.detach()]))"),
    "gru_state_passed_back.py": ("passed", "logits, state = tagger(window, state.detach())"),
    "lstm_lm_partial_repackage.py": ("produced", "return h[0].detach(), h[1].detach()"),
    "lstm_repackage_unpacked.py": ("produced", "return h.detach(), c.detach()"),
    "memory_bank_queue.py": ("produced", "memory_bank.append(key.detach())"),
    "tracker_previous_embeddings.py": ("carried", "similarity = embeddings @ previous.detach().t() / 0.07"),
    "world_model_latent.py": ("passed", "latent, predicted = model(latent.detach(), action)"),
}


def test_every_program_has_its_fix() -> None:
    assert sorted(FIXES) == FAILING


@pytest.mark.parametrize("name", FAILING)
def test_report_names_the_chain_of_lines(name: str, runs: dict) -> None:
    proc, report, _ = runs[name]
    assert_error_report(proc, report, "graph_freed", f"{FOLDER}/{name}")
    marks = lines_by_role(CASES / name, MARK, tuple(ROLES))
    found = {mark: {s["line"] for s in report["sites"] if s["role"] == role} for mark, role in ROLES.items()}
    assert found == marks
    assert [s["role"] for s in report["sites"]][-1] == "failed at"


@pytest.mark.parametrize("name", FAILING)
def test_fix_detaches_where_the_state_is_made_and_runs_clean(name: str, runs: dict) -> None:
    _, report, patched = runs[name]
    role, code = FIXES[name]
    (line,) = lines_by_role(CASES / name, MARK, tuple(ROLES))[role]
    assert [(p["line"], p["code"]) for p in report["patches"]] == [(line, code)]
    assert "retain_graph" not in report["fix"] and ".detach()" in report["fix"]
    assert (patched.returncode, patched.stdout, patched.stderr) == (0, "", "")
