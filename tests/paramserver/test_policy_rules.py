"""Consistency modes are policy objects (``scaleforge.paramserver.consistency``): read from the source
(AST), no other module branches on a mode's name; the policies the config offers are those that exist;
and each policy's rule says what its mode means."""

import ast
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
from conftest import REPO

from scaleforge.config.async_sgd import ServerSpec
from scaleforge.paramserver.consistency import POLICIES, SSP, Async, Sync, consistency_of

LIBRARY = REPO / "platform" / "scaleforge"
POLICY_MODULE = LIBRARY / "paramserver" / "consistency.py"


def _is_mode(node: ast.AST) -> bool:
    """``mode`` or ``<anything>.mode``."""
    return (isinstance(node, ast.Name) and node.id == "mode") or (
        isinstance(node, ast.Attribute) and node.attr == "mode"
    )


def _strings(node: ast.AST) -> set[str]:
    """The string literals of ``node``: itself, or the items of a tuple, list or set."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def _mode_tests(source: str, names: "set[str] | None" = None) -> list[tuple[int, str]]:
    """Every place that tests a mode against a string: ``mode == "sync"``, ``cfg.server.mode in ("a",
    "b")``, ``match mode: case "ssp"``. With ``names``, any comparison with one of those strings
    counts, whatever it is compared with."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            literals = set().union(*map(_strings, sides))
            if (literals and any(map(_is_mode, sides))) or (names and literals & names):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match) and _is_mode(node.subject):
            found.append((node.lineno, f"match {ast.unparse(node.subject)}"))
    return found


def _violations(paths, names=None) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{line}: {text}"
        for path in paths
        if path != POLICY_MODULE
        for line, text in _mode_tests(path.read_text(), names)
    ]


def test_no_paramserver_module_but_the_policies_compares_a_mode_to_a_string():
    assert _violations(sorted((LIBRARY / "paramserver").rglob("*.py"))) == []


def test_no_library_or_job_module_compares_with_a_consistency_mode_name():
    """The config asks the policies what a mode takes (backup workers, weight prediction)."""
    paths = sorted([*LIBRARY.rglob("*.py"), *(REPO / "jobs").rglob("*.py")])
    assert _violations(paths, names=set(POLICIES)) == []


@pytest.mark.parametrize(
    "source",
    [
        'if mode == "sync": pass',
        'if self.mode != "ssp": pass',
        'if cfg.server.mode in ("sync", "ssp"): pass',
        'ok = "async" == server.mode',
        'match mode:\n    case "sync":\n        pass',
    ],
)
def test_the_rule_reader_sees_every_way_to_branch_on_a_mode(source):
    """The checks above would pass vacuously if a form of the comparison were missed."""
    assert len(_mode_tests(source)) == 1
    assert _mode_tests("if policy.in_rounds and kind == 'x': pass") == []
    assert len(_mode_tests('if kind == "ssp": pass', names={"ssp"})) == 1


def test_the_config_offers_exactly_the_policies_there_are():
    offered = set(get_args(ServerSpec.model_fields["mode"].annotation))
    assert offered == set(POLICIES)
    assert consistency_of(ServerSpec(mode="ssp", staleness_bound=3)) == SSP(bound=3)
    assert consistency_of(ServerSpec(mode="sync", backup_workers=1)) == Sync(backup_workers=1)
    assert consistency_of(ServerSpec(mode="async")) == Async()


def test_each_policy_rule_reads_and_applies_as_its_mode_says():
    grad = np.ones(2, np.float32)
    free = Async().for_shard()
    assert free.may_read(0, clock=50, slowest=0) and free.admit(0, grad, read_version=0, version=9)
    assert free.update(grad, active=[0, 1]) is grad and free.leave(1, active=[0]) is None

    bounded = SSP(bound=2).for_shard()
    assert bounded.may_read(0, clock=5, slowest=3) and not bounded.may_read(0, clock=6, slowest=3)
    assert bounded.update(grad, active=[0, 1]) is grad

    rounds = Sync().for_shard()
    assert rounds.admit(0, grad, read_version=4, version=4) and rounds.update(grad, active=[0, 1]) is None
    assert not rounds.may_read(0, clock=5, slowest=4)  # it gave to this round: it waits for the update
    assert not rounds.admit(1, 3 * grad, read_version=3, version=4)  # computed on an older version: late
    np.testing.assert_array_equal(rounds.leave(1, active=[0]), grad)  # the round no longer waits for 1
    assert rounds.may_read(0, clock=5, slowest=4) and rounds.dropped == {1: 1}
    two_of_three = Sync(backup_workers=1).for_shard()
    for worker, value in ((0, 1.0), (1, 3.0)):
        assert two_of_three.admit(worker, value * grad, read_version=0, version=0)
    np.testing.assert_array_equal(two_of_three.update(grad, active=[0, 1, 2]), 2 * grad)


def test_a_mode_name_appears_in_the_policy_module_only_as_a_policy_name():
    """The policy module itself keys modes by name once (``POLICIES``), never by comparing."""
    assert _mode_tests(Path(POLICY_MODULE).read_text(), names=set(POLICIES)) == []
