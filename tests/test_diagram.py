"""The workflow diagram: layout, SVG, instance marks and ``manage.py workflow_diagram``."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import vertique_workflow as wf
from tests.conftest import run_manage
from tests.flows import workflows as flows
from vertique_workflow.definitions import Plan, Step, TaskSpec, Workflow
from vertique_workflow.definitions.validation import MAX_NAME_LENGTH, transitions
from vertique_workflow.diagram import (
    BranchMark,
    Marks,
    instance_marks,
    layout,
    marks_from_history,
    render_svg,
)
from vertique_workflow.exceptions import WorkflowDefinitionError, WorkflowNotFound
from vertique_workflow.testing import run_until_idle

NS = {"svg": "http://www.w3.org/2000/svg"}
SVG = "{http://www.w3.org/2000/svg}"

FLOWS = sorted(
    (
        obj
        for obj in vars(flows).values()
        if isinstance(obj, type)
        and issubclass(obj, Workflow)
        and obj is not Workflow
        and obj.__module__ == flows.__name__
    ),
    key=lambda cls: cls.id,
)


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def classes(element: ET.Element) -> set[str]:
    return set((element.get("class") or "").split())


def steps_of(root: ET.Element) -> dict[str, ET.Element]:
    found = {}
    for group in root.iter(f"{SVG}g"):
        if "step" in classes(group):
            assert group.get("data-step") not in found, "one node per step"
            found[group.get("data-step")] = group
    return found


def edges_of(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if "edge" in classes(g)]


def hit_rect(group: ET.Element) -> tuple[float, float, float, float]:
    (rect,) = [r for r in group.findall(f"{SVG}rect") if "hit" in classes(r)]
    return tuple(float(rect.get(name)) for name in ("x", "y", "width", "height"))  # type: ignore[return-value]


def assert_picture_of(plan: Plan, svg: str) -> ET.Element:
    """The structural promises of every picture: nodes, edges, no overlap, self-contained."""
    root = parse(svg)
    nodes = steps_of(root)
    assert list(nodes) == list(plan.steps)
    for step_id, group in nodes.items():
        assert f"kind-{plan.steps[step_id].kind}" in classes(group)
        assert group.get("id", "").startswith("step-")
    assert len({g.get("id") for g in nodes.values()}) == len(nodes)
    pairs = {(g.get("data-from"), g.get("data-to")) for g in edges_of(root)}
    wanted = {(s.id, t.target) for s in plan.steps.values() for t in transitions(s)}
    assert pairs == wanted
    boxes = [hit_rect(g) for g in nodes.values()]
    for (x1, y1, w1, h1), (x2, y2, w2, h2) in itertools.combinations(boxes, 2):
        apart = x1 + w1 <= x2 or x2 + w2 <= x1 or y1 + h1 <= y2 or y2 + h2 <= y1
        assert apart, f"boxes overlap: {(x1, y1, w1, h1)} {(x2, y2, w2, h2)}"
    width, height = float(root.get("width")), float(root.get("height"))
    for x, y, w, h in boxes:
        assert x >= 0 and x + w <= width and y >= 0 and y + h <= height
    # self-contained: no script, link or outside resource in the markup. Checked on the
    # parsed elements, not the text: a step id such as "href" or "url(" is the picture's
    # own text (a label, a title, a data attribute) and must not count as one.
    assert not any(element.tag.endswith("script") for element in root.iter())
    for element in root.iter():
        for name, value in element.attrib.items():
            assert not name.endswith("href"), f"a link: {name}={value!r}"
            if not name.startswith("data-"):
                assert "url(" not in value and "javascript:" not in value.lower(), (name, value)
    style = root.find("svg:style", NS)
    assert style is not None
    assert "url(" not in (style.text or "") and "@import" not in (style.text or "")
    return root


# -- pictures of plans (no database) ---------------------------------------------------


@pytest.mark.parametrize("flow", FLOWS, ids=lambda cls: cls.id)
def test_every_example_flow_draws_each_step_and_each_transition(flow):
    plan = flow.plan()
    svg = render_svg(plan)
    assert_picture_of(plan, svg)
    assert render_svg(plan) == svg, "the same plan gives the same bytes"


def test_the_picture_is_the_same_bytes_for_an_equal_plan_built_again():
    plan = flows.ParallelFlow.plan()
    again = Plan.from_steps(
        list(plan.steps.values()),
        id=plan.id,
        version=plan.version,
        contract=plan.contract,
        start=plan.start,
        signals=dict(plan.signals),
    )
    marks = Marks(frozenset({"wait_b", "split"}), frozenset({"split", "run_a"}))
    assert render_svg(again, marks) == render_svg(plan, marks)


def test_step_shapes_labels_and_edge_labels_of_the_order_flow():
    plan = flows.OrderFlow.plan()
    root = assert_picture_of(plan, render_svg(plan, title="Orders"))
    assert root.find("svg:title", NS).text == "Orders"
    nodes = steps_of(root)
    assert nodes["route"].find("svg:polygon", NS) is not None, "a decision is a diamond"
    assert nodes["done"].find("svg:circle", NS) is not None, "an end is a circle"
    edges = {(g.get("data-from"), g.get("data-to")): g for g in edges_of(root)}
    paid = edges[("await_payment", "ship")]
    assert paid.find("svg:text", NS).text == "paid"
    assert "kind-next" in classes(paid)
    assert edges[("route", "done")].find("svg:text", NS) is None


def test_edge_labels_name_signal_routes_timeouts_task_decisions_and_outcomes():
    def labels(flow: type[Workflow[Any]]) -> dict[tuple[str, str], str]:
        root = parse(render_svg(flow.plan()))
        return {
            (g.get("data-from"), g.get("data-to")): g.find("svg:text", NS).text
            for g in edges_of(root)
            if g.find("svg:text", NS) is not None
        }

    assert labels(flows.ExpenseApproval) == {
        ("approval", "done"): "approve",
        ("approval", "rejected"): "reject",
    }
    review = labels(flows.ReviewFlow)
    assert review[("review", "approved")] == "approve"
    assert review[("review", "rejected")] == "reject"
    assert review[("review", "escalated")] == "due 3d"
    parent = labels(flows.ParentFlow)
    assert parent[("delegate", "done")] == "completed"
    assert parent[("delegate", "recover")] == "failed"
    partial = labels(flows.PartialFlow)
    assert partial[("joined", "gave_up")] == "failed"
    assert partial[("split", "ok_a")] == "a"
    assert labels(flows.FanFlow)[("spread", "work")] == "each items"
    receipt = labels(flows.ReceiptFlow)
    assert any(text.startswith("timeout ") for text in receipt.values()), receipt


def test_a_join_sits_below_its_branches_which_sit_side_by_side():
    for flow in (flows.ParallelFlow, flows.NestedFlow, flows.PartialFlow, flows.RaceFlow):
        plan = flow.plan()
        drawn = layout(plan)
        for step in plan.steps.values():
            if step.kind != "fork":
                continue
            firsts = [t.target for t in transitions(step) if t.kind == "branch"]
            tops = {drawn.boxes[first].y for first in firsts}
            assert len({drawn.layers[first] for first in firsts}) == 1, (plan.id, firsts)
            xs = [drawn.boxes[first].x for first in firsts]
            assert len(set(xs)) == len(xs)
            join = drawn.boxes[step.fork.join]
            assert all(join.y > top for top in tops)
            assert drawn.layers[step.fork.join] > drawn.layers[step.id]


def _collect(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return state


def _choose(state: dict[str, Any], ctx: Any) -> str:
    return "done"


def loop_plan(**names: str) -> Plan:
    """collect waits for items (each one added, then back to collect) until close."""
    collect, add, done, item, close = (
        names.get(key, key) for key in ("collect", "add", "done", "item", "close")
    )
    return Plan.from_steps(
        [
            Step(collect, "wait", signals=(item, close), on_signal={item: add, close: done}),
            Step(add, "action", callback=_collect, next=collect),
            Step(done, "end"),
        ],
        id="loop",
        version=1,
        contract="loop.v1",
        start=collect,
        signals={item: None, close: None},
    )


def test_a_loop_is_a_back_arc_right_of_the_boxes_it_spans():
    plan = loop_plan()
    root = assert_picture_of(plan, render_svg(plan))
    edges = {(g.get("data-from"), g.get("data-to")): g for g in edges_of(root)}
    back = edges[("add", "collect")]
    assert "back" in classes(back)
    assert "back" not in classes(edges[("collect", "add")])
    drawn = layout(plan)
    (route,) = [r for r in drawn.routes if r.back]
    rightmost = max(box.right for box in drawn.boxes.values())
    assert max(x for x, _ in route.points) > rightmost
    assert drawn.layers["add"] > drawn.layers["collect"]


def test_hostile_step_ids_and_signal_names_are_escaped():
    hostile = {
        "collect": "<script>alert('x')</script>",
        "add": "a \"quoted\" & 'single' <b>",
        "done": "naïve 🚀 步骤 \u202eevil",
        "item": "<img src=x onerror=alert(1)>",
        "close": 'close & "leave"\n\tnow',
    }
    plan = loop_plan(**hostile)
    svg = render_svg(plan, Marks(frozenset({hostile["collect"]}), frozenset({hostile["add"]})))
    assert "<script" not in svg and "<img" not in svg and "<b>" not in svg
    root = assert_picture_of(plan, svg)
    nodes = steps_of(root)
    assert set(nodes) == {hostile["collect"], hostile["add"], hostile["done"]}
    assert "current" in classes(nodes[hostile["collect"]])
    assert "visited" in classes(nodes[hostile["add"]])
    for step_id, group in nodes.items():
        assert group.find("svg:title", NS).text.startswith(step_id)
        assert all(ch.isalnum() or ch in "-_" for ch in group.get("id"))
    texts = "".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert hostile["item"] in texts, "a signal name is shown as text, never as markup"


def test_step_ids_that_spell_links_are_text_and_the_picture_stays_self_contained():
    """Found by the random-plan test: a step named ``href`` is a label, not a link."""
    plan = loop_plan(collect="href", add="url(javascript:x)", done="@import")
    svg = render_svg(plan, Marks(frozenset({"href"}), frozenset()))
    root = assert_picture_of(plan, svg)
    assert set(steps_of(root)) == {"href", "url(javascript:x)", "@import"}


def test_unusable_characters_become_replacement_characters_and_the_picture_parses():
    plan = loop_plan(collect="bell\x07step", add="nul-free\x1bstep")
    root = assert_picture_of_with_replacements(plan)
    assert set(steps_of(root)) == {"bell\ufffdstep", "nul-free\ufffdstep", "done"}


def assert_picture_of_with_replacements(plan: Plan) -> ET.Element:
    root = parse(render_svg(plan))
    assert len(steps_of(root)) == len(plan.steps)
    return root


def test_a_long_label_is_truncated_and_its_title_holds_the_full_id():
    long_id = "a_really_long_step_identifier_that_goes_on_" + "x" * 150
    plan = loop_plan(add=long_id)
    root = assert_picture_of(plan, render_svg(plan))
    group = steps_of(root)[long_id]
    label = group.find("svg:text", NS).text
    assert label.endswith("\u2026") and len(label) < 30
    assert long_id in group.find("svg:title", NS).text


def test_branch_badges_show_the_branch_and_its_status_or_counts_when_many():
    plan = flows.SignalledFanFlow.plan()
    few = Marks(
        frozenset({"wait_go"}),
        frozenset({"spread"}),
        (BranchMark("wait_go", "0", "WAITING"), BranchMark("gathered", "1", "COMPLETED")),
    )
    root = parse(render_svg(plan, few))
    badges = {
        g.find("svg:text", NS).text: classes(g)
        for g in root.iter(f"{SVG}g")
        if "badge" in classes(g)
    }
    assert badges == {
        "0 \u00b7 WAITING": {"badge", "status-waiting"},
        "1 \u00b7 COMPLETED": {"badge", "status-completed"},
    }
    many = Marks(
        branches=(
            *(BranchMark("wait_go", str(i), "WAITING") for i in range(40)),
            BranchMark("wait_go", "x", "RETRY_SCHEDULED"),
        )
    )
    root = parse(render_svg(plan, many))
    group = steps_of(root)["wait_go"]
    texts = [g.find("svg:text", NS).text for g in group.iter(f"{SVG}g") if "badge" in classes(g)]
    assert texts == ["RETRY_SCHEDULED \u00d71", "WAITING \u00d740"]


# -- hypothesis: random valid plans never crash the picture ----------------------------

_names = st.text(
    # control characters XML cannot carry become U+FFFD (tested above): tab, CR, LF survive
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"), include_characters="\t\n\r"),
    min_size=1,
    max_size=40,
).filter(lambda s: s == s.strip() and len(s) <= MAX_NAME_LENGTH)


@st.composite
def random_plans(draw: st.DrawFn) -> Plan:
    ids = draw(st.lists(_names, min_size=2, max_size=12, unique=True))
    signals = draw(st.lists(_names, min_size=1, max_size=3, unique=True))
    count = len(ids)
    middle = st.sampled_from(["action", "decision", "wait", "timer", "task"])
    kinds = [
        *draw(st.lists(middle, min_size=count - 1, max_size=count - 1)),
        draw(st.sampled_from(["end", "fail"])),
    ]
    steps = []
    for index, (step_id, kind) in enumerate(zip(ids, kinds, strict=True)):
        anywhere = st.sampled_from(ids)
        forward = st.sampled_from(ids[index + 1 :]) if index + 1 < count else anywhere
        if kind == "action":
            steps.append(Step(step_id, "action", callback=_collect, next=draw(forward)))
        elif kind == "decision":
            targets = draw(st.lists(anywhere, min_size=1, max_size=3, unique=True))
            if ids[index + 1] not in targets:
                targets.append(ids[index + 1])
            steps.append(Step(step_id, "decision", callback=_choose, targets=tuple(targets)))
        elif kind == "wait":
            waits = draw(st.lists(st.sampled_from(signals), min_size=1, unique=True))
            routes = {name: draw(anywhere) for name in waits[1:]}
            timeout = draw(st.sampled_from([None, "1h"]))
            steps.append(
                Step(
                    step_id,
                    "wait",
                    signals=tuple(waits),
                    on_signal=routes,
                    next=ids[index + 1],
                    timeout=timeout,
                    on_timeout=draw(anywhere) if timeout else None,
                )
            )
        elif kind == "timer":
            steps.append(Step(step_id, "timer", delay="5m", next=draw(forward)))
        elif kind == "task":
            decisions = {"ok": ids[index + 1], "back": draw(anywhere)}
            steps.append(Step(step_id, "task", task=TaskSpec(assignee="ann", decisions=decisions)))
        else:
            steps.append(Step(step_id, kind, reason="R" if kind == "fail" else None))
    try:
        return Plan.from_steps(
            steps,
            id="random",
            version=1,
            contract="random.v1",
            start=ids[0],
            signals=dict.fromkeys(signals),
        )
    except WorkflowDefinitionError:
        assume(False)
        raise


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(plan=random_plans(), data=st.data())
def test_random_valid_plans_always_draw_a_sound_picture(plan, data):
    step_ids = list(plan.steps)
    chosen = st.lists(st.sampled_from(step_ids), unique=True)
    marks = Marks(
        frozenset(data.draw(chosen)),
        frozenset(data.draw(chosen)),
        tuple(
            BranchMark(step, branch, status)
            for step, branch, status in data.draw(
                st.lists(st.tuples(st.sampled_from(step_ids), _names, _names), max_size=6)
            )
        ),
    )
    svg = render_svg(plan, marks)
    assert_picture_of(plan, svg)
    assert render_svg(plan, marks) == svg


# -- where an instance stands (real runs) ----------------------------------------------

db = pytest.mark.django_db(transaction=True)


def marked(root: ET.Element, name: str) -> set[str]:
    return {step for step, group in steps_of(root).items() if name in classes(group)}


@db
def test_an_instance_shows_its_current_and_visited_steps_and_its_past():
    ref = wf.start("order", {"amount": 5}, idempotency_key="diagram-1")
    run_until_idle()
    plan, marks = instance_marks(ref.id)
    assert plan is flows.OrderFlow.plan()
    assert marks.current == {"await_payment"}
    assert marks.visited == {"reserve", "route", "await_payment"}
    root = parse(render_svg(plan, marks))
    assert marked(root, "current") == {"await_payment"}
    assert marked(root, "visited") == {"reserve", "route", "await_payment"}

    waiting = [e for e in wf.history_of(ref.id) if e["outcome"] == "WAITING"][-1]["sequence"]
    wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="pay")
    run_until_idle()
    _, now = instance_marks(ref.id)
    assert now.current == {"done"}
    assert now.visited == {"reserve", "route", "await_payment", "ship", "done"}

    _, then = instance_marks(ref.id, upto_sequence=waiting)
    assert then == marks_from_history(plan, wf.history_of(ref.id), waiting)
    assert then.current == {"await_payment"}
    assert then.visited == {"reserve", "route", "await_payment"}
    first = wf.history_of(ref.id)[0]["sequence"]
    _, start = instance_marks(ref.id, upto_sequence=first - 1)
    assert start == Marks()


@db
def test_branch_tokens_are_current_with_badges_at_their_steps():
    ref = wf.start("parallel", {}, idempotency_key="diagram-2")
    run_until_idle()
    plan, marks = instance_marks(ref.id)
    assert marks.current == {"split", "wait_b", "wait_c"}
    assert {"split", "run_a", "wait_b", "wait_c"} <= marks.visited
    assert sorted((m.step_id, m.branch_id, m.status) for m in marks.branches) == [
        ("joined", "a", "COMPLETED"),
        ("wait_b", "b", "WAITING"),
        ("wait_c", "c", "WAITING"),
    ]
    root = parse(render_svg(plan, marks))
    badge = next(g for g in steps_of(root)["wait_b"].iter(f"{SVG}g") if "badge" in classes(g))
    assert badge.find("svg:text", NS).text == "b \u00b7 WAITING"

    entries = wf.history_of(ref.id)
    last = entries[-1]["sequence"]
    _, past = instance_marks(ref.id, upto_sequence=last)
    assert {(m.step_id, m.branch_id) for m in past.branches} >= {("wait_b", "b"), ("wait_c", "c")}
    assert past.current == {"split"}


@db
def test_the_marks_of_every_past_moment_follow_the_rule_of_marks_from_history():
    """The store's per-step aggregate gives what the rule over every entry gives."""
    ref = wf.start("nested", {}, idempotency_key="diagram-3")
    run_until_idle()
    for fork_step, branch in (("inner", "q"), ("outer", "y")):
        wf.signal(ref.id, "go", None, dedup_key=f"go-{branch}", branch=(fork_step, branch))
        run_until_idle()
    assert wf.get(ref.id).status == "COMPLETED"
    plan = instance_marks(ref.id)[0]
    entries = wf.history_of(ref.id)
    assert any(e["event_type"] == "BRANCH_DECISION" for e in entries)
    for entry in entries:
        sequence = entry["sequence"]
        _, then = instance_marks(ref.id, upto_sequence=sequence)
        assert then == marks_from_history(plan, entries, sequence), f"after entry {sequence}"


@db
def test_instance_marks_refuses_an_unknown_instance():
    with pytest.raises(WorkflowNotFound):
        instance_marks("00000000-0000-0000-0000-000000000000")
    with pytest.raises(WorkflowNotFound):
        instance_marks("not-a-uuid")


# -- manage.py workflow_diagram ----------------------------------------------------------


@pytest.mark.slow  # manage.py processes (not run in the schema env)
@db
def test_the_command_writes_the_definition_and_an_instance_picture():
    ref = wf.start("order", {"amount": 5}, idempotency_key="diagram-3")
    run_until_idle()
    name = connection.settings_dict["NAME"]
    result = run_manage("workflow_diagram", "order", dbname=name)
    plan = flows.OrderFlow.plan()
    assert result.stdout == render_svg(plan)
    assert_picture_of(plan, result.stdout)
    waiting = [e for e in wf.history_of(ref.id) if e["outcome"] == "WAITING"][-1]["sequence"]
    result = run_manage(
        "workflow_diagram", "order", "--instance", str(ref.id), "--upto", str(waiting), dbname=name
    )
    assert marked(parse(result.stdout), "current") == {"await_payment"}
    refused = run_manage("workflow_diagram", "no-such-flow", dbname=name, check=False)
    assert refused.returncode != 0 and refused.stdout == ""
    assert "'no-such-flow' does not exist" in refused.stderr


@db
def test_the_command_refuses_unknown_ids_versions_and_instances():
    ref = wf.start("order", {"amount": 5}, idempotency_key="diagram-4")
    run_until_idle()
    cases = [
        (("no-such-flow",), "does not exist"),
        (("order", "--version", "9"), "no plan of workflow 'order' version 9"),
        (("order", "--version", "0"), "positive"),
        (("order", "--instance", "00000000-0000-0000-0000-000000000000"), "no workflow instance"),
        (("order", "--instance", "nope"), "no workflow instance"),
        (("parallel", "--instance", str(ref.id)), "is a 'order' workflow"),
        (("order", "--upto", "3"), "--upto needs --instance"),
        (("order", "--instance", str(ref.id), "--version", "1"), "an instance has its own pin"),
    ]
    for args, message in cases:
        with pytest.raises(CommandError, match=message):
            call_command("workflow_diagram", *args)
    # an explicit version of the catalog draws that version
    from io import StringIO

    out = StringIO()
    call_command("workflow_diagram", "order", "--version", "1", stdout=out)
    assert out.getvalue() == render_svg(flows.OrderFlow.plan())


@db
def test_instance_marks_costs_a_bounded_number_of_queries(django_assert_max_num_queries):
    ref = wf.start("fan", {"items": list(range(30))}, idempotency_key="diagram-5")
    run_until_idle()
    with django_assert_max_num_queries(8):
        _, marks = instance_marks(ref.id)
    assert len(marks.branches) == 30
    assert "work" in marks.visited
