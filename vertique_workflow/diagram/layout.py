"""A small layered layout: where each step's box goes and which way each edge runs.

The classic recipe, kept small and deterministic (no randomness, no set
iteration, ties broken by declaration order):

1. Depth-first search from the start step, following transitions in
   declaration order: an edge to a step still on the search path closes a
   loop and is a *back edge*; every other edge points down.
2. Longest-path layering over the forward edges: a step sits one layer below
   the lowest step leading to it, so a join sits below all its branches and
   a fork's branches sit side by side in the layer below the fork.
3. A forward edge spanning several layers gets one virtual point per layer
   it crosses, so it is routed around the boxes in between.
4. Barycentric ordering within layers (sweeps down and up, keeping the
   ordering with the fewest crossings), then x positions pulled towards
   the boxes each box is connected to, never closer than a gap.
5. Back edges leave the bottom of their step, run right of every box of
   the layers they span, and enter their target from above: a loop is an
   arc on the right side, never through a box.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..definitions.plan import Plan
from .graph import Edge, plan_edges
from .text import label_width

__all__ = ["NODE_HEIGHT", "NODE_WIDTH", "Box", "Layout", "Route", "layout"]

NODE_WIDTH = 160.0
NODE_HEIGHT: dict[str, float] = {
    "action": 40.0,
    "decision": 56.0,
    "wait": 46.0,
    "timer": 46.0,
    "task": 46.0,
    "call": 46.0,
    "service": 46.0,
    "fork": 20.0,
    "join": 20.0,
    "end": 50.0,
    "fail": 50.0,
}
MARGIN = 28.0
LAYER_GAP = 58.0  # vertical room between two layers: edge labels and badges live here
NODE_GAP = 40.0  # horizontal room between two boxes of a layer
VIRTUAL_WIDTH = 14.0  # the room a long edge takes when it passes a layer
BACK_LANE = 14.0  # distance between two back edges running side by side
_SWEEPS = 8
_PLACEMENT_ROUNDS = 6
# how far apart the ports of several edges leaving/entering one box are, by kind
_PORT_SPACING = {"decision": 0.0, "end": 5.0, "fail": 5.0}
_DEFAULT_PORT_SPACING = 16.0


@dataclass(frozen=True)
class Box:
    """A step's rectangle (top-left corner, size): the shape is drawn inside it."""

    x: float
    y: float
    w: float
    h: float

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def right(self) -> float:
        return self.x + self.w

    @property
    def bottom(self) -> float:
        return self.y + self.h


@dataclass(frozen=True)
class Route:
    """How one edge is drawn: its points from the source's port to the target's.

    A forward route alternates "leave downwards" and "arrive from above"
    points (drawn as vertical S-curves, straight through virtual points); a
    back route is a polyline. ``label_at`` is where the label goes and
    ``label_anchor`` its SVG ``text-anchor``.
    """

    edge: Edge
    points: tuple[tuple[float, float], ...]
    back: bool
    label_at: tuple[float, float]
    label_anchor: str


@dataclass(frozen=True)
class Layout:
    """The whole picture: its size, a box per step, a route per edge, each step's layer."""

    width: float
    height: float
    boxes: dict[str, Box]
    routes: list[Route]
    layers: dict[str, int] = field(default_factory=dict)


@dataclass
class _Node:
    key: int
    layer: int
    width: float
    height: float
    step: str | None  # None: a virtual point of a long edge
    rank: float  # discovery rank, the tie breaker
    x: float = 0.0


def _search(plan: Plan, edges: list[Edge]) -> tuple[dict[str, int], set[int], list[str]]:
    """Discovery rank of each step, the back edges (by index), and a topological order."""
    leaving: dict[str, list[int]] = {step_id: [] for step_id in plan.steps}
    for index, edge in enumerate(edges):
        leaving[edge.source].append(index)
    rank: dict[str, int] = {}
    finished: list[str] = []
    back: set[int] = set()
    on_path: set[str] = set()
    roots = [plan.start, *(step_id for step_id in plan.steps if step_id != plan.start)]
    for root in roots:
        if root in rank:
            continue
        rank[root] = len(rank)
        on_path.add(root)
        stack = [(root, iter(leaving[root]))]
        while stack:
            step_id, pending = stack[-1]
            index = next(pending, None)
            if index is None:
                stack.pop()
                on_path.discard(step_id)
                finished.append(step_id)
                continue
            target = edges[index].target
            if target in on_path:
                back.add(index)
            elif target not in rank:
                rank[target] = len(rank)
                on_path.add(target)
                stack.append((target, iter(leaving[target])))
    return rank, back, finished[::-1]


def _crossings(
    layers: list[list[int]], segments: list[tuple[int, int]], pos: dict[int, int]
) -> int:
    by_layer: dict[int, list[tuple[int, int]]] = {}
    layer_of = {key: number for number, keys in enumerate(layers) for key in keys}
    for upper, lower in segments:
        by_layer.setdefault(layer_of[upper], []).append((pos[upper], pos[lower]))
    total = 0
    for pairs in by_layer.values():
        for i, (a1, b1) in enumerate(pairs):
            for a2, b2 in pairs[i + 1 :]:
                if (a1 - a2) * (b1 - b2) < 0:
                    total += 1
    return total


def _order(layers: list[list[int]], segments: list[tuple[int, int]], nodes: list[_Node]) -> None:
    """Reorder each layer in place to reduce crossings (barycenters, best of several sweeps)."""
    up: dict[int, list[int]] = {node.key: [] for node in nodes}
    down: dict[int, list[int]] = {node.key: [] for node in nodes}
    for upper, lower in segments:
        down[upper].append(lower)
        up[lower].append(upper)

    def positions() -> dict[int, int]:
        return {key: index for keys in layers for index, key in enumerate(keys)}

    # first ordering: below the leftmost node leading to it, ties by discovery
    pos = positions()
    for number in range(1, len(layers)):
        layers[number].sort(
            key=lambda k: (min((pos[u] for u in up[k]), default=len(pos)), nodes[k].rank)
        )
        pos.update({key: index for index, key in enumerate(layers[number])})
    best = [list(keys) for keys in layers]
    best_count = _crossings(layers, segments, pos)
    for sweep in range(_SWEEPS):
        downwards = sweep % 2 == 0
        numbers = range(1, len(layers)) if downwards else range(len(layers) - 2, -1, -1)
        neighbours = up if downwards else down
        for number in numbers:
            current = {key: index for index, key in enumerate(layers[number])}

            def barycenter(
                key: int,
                current: dict[int, int] = current,
                neighbours: dict[int, list[int]] = neighbours,
            ) -> tuple[float, int]:
                near = neighbours[key]
                if not near:
                    return (float(current[key]), current[key])
                return (sum(pos[k] for k in near) / len(near), current[key])

            layers[number].sort(key=barycenter)
            pos.update({key: index for index, key in enumerate(layers[number])})
        count = _crossings(layers, segments, pos)
        if count < best_count:
            best, best_count = [list(keys) for keys in layers], count
    layers[:] = best


def _place(layers: list[list[int]], segments: list[tuple[int, int]], nodes: list[_Node]) -> None:
    """Give each node an x (its center): near its neighbours, a gap from the next box."""
    up: dict[int, list[int]] = {node.key: [] for node in nodes}
    down: dict[int, list[int]] = {node.key: [] for node in nodes}
    for upper, lower in segments:
        down[upper].append(lower)
        up[lower].append(upper)

    def separation(left: _Node, right: _Node) -> float:
        gap = NODE_GAP if left.step is not None and right.step is not None else NODE_GAP / 2
        return (left.width + right.width) / 2 + gap

    for keys in layers:  # packed, centered on 0
        x = 0.0
        for index, key in enumerate(keys):
            if index:
                x += separation(nodes[keys[index - 1]], nodes[key])
            nodes[key].x = x
        for key in keys:
            nodes[key].x -= x / 2
    for round_number in range(_PLACEMENT_ROUNDS):
        downwards = round_number % 2 == 0
        numbers = range(1, len(layers)) if downwards else range(len(layers) - 2, -1, -1)
        neighbours = up if downwards else down
        for number in numbers:
            keys = layers[number]
            wanted = []
            for key in keys:
                near = neighbours[key]
                if near:
                    wanted.append(sum(nodes[k].x for k in near) / len(near))
                else:
                    wanted.append(nodes[key].x)
            # two feasible placements (pushed right, pushed left); their mean is feasible too
            pushed = list(wanted)
            for i in range(1, len(keys)):
                least = pushed[i - 1] + separation(nodes[keys[i - 1]], nodes[keys[i]])
                pushed[i] = max(pushed[i], least)
            pulled = list(wanted)
            for i in range(len(keys) - 2, -1, -1):
                most = pulled[i + 1] - separation(nodes[keys[i]], nodes[keys[i + 1]])
                pulled[i] = min(pulled[i], most)
            for i, key in enumerate(keys):
                nodes[key].x = (pushed[i] + pulled[i]) / 2


def _spread(count: int, spacing: float) -> list[float]:
    return [(index - (count - 1) / 2) * spacing for index in range(count)]


def layout(plan: Plan) -> Layout:
    """Lay ``plan`` out: boxes, edge routes and the picture's size (pure, deterministic)."""
    edges = plan_edges(plan)
    rank, back, topological = _search(plan, edges)
    forward: dict[str, list[str]] = {step_id: [] for step_id in plan.steps}
    for index, edge in enumerate(edges):
        if index not in back:
            forward[edge.source].append(edge.target)
    layer: dict[str, int] = dict.fromkeys(plan.steps, 0)
    for step_id in topological:
        for target in forward[step_id]:
            layer[target] = max(layer[target], layer[step_id] + 1)

    nodes: list[_Node] = []
    key_of: dict[str, int] = {}
    for step_id, step in plan.steps.items():
        key_of[step_id] = len(nodes)
        nodes.append(
            _Node(
                len(nodes),
                layer[step_id],
                NODE_WIDTH,
                NODE_HEIGHT[step.kind],
                step_id,
                rank[step_id],
            )
        )
    segments: list[tuple[int, int]] = []
    chains: dict[int, list[int]] = {}  # forward edge index -> its node keys, source to target
    for index, edge in enumerate(edges):
        if index in back:
            continue
        chain = [key_of[edge.source]]
        for number in range(layer[edge.source] + 1, layer[edge.target]):
            virtual = _Node(len(nodes), number, VIRTUAL_WIDTH, 0.0, None, rank[edge.source] + 0.5)
            nodes.append(virtual)
            chain.append(virtual.key)
        chain.append(key_of[edge.target])
        chains[index] = chain
        segments.extend(itertools.pairwise(chain))

    depth = max(layer.values()) + 1
    layers: list[list[int]] = [[] for _ in range(depth)]
    for node in sorted(nodes, key=lambda n: (n.rank, n.key)):
        layers[node.layer].append(node.key)
    _order(layers, segments, nodes)
    _place(layers, segments, nodes)

    # rows: each layer as tall as its tallest box, boxes centered in their row
    row_top: list[float] = []
    row_height: list[float] = []
    y = MARGIN
    for keys in layers:
        height = max((nodes[k].height for k in keys if nodes[k].step is not None), default=0.0)
        row_top.append(y)
        row_height.append(height)
        y += height + LAYER_GAP
    left = min(node.x - node.width / 2 for node in nodes)
    shift = MARGIN - left
    boxes: dict[str, Box] = {}
    for node in nodes:
        node.x += shift
        if node.step is not None:
            top = row_top[node.layer] + (row_height[node.layer] - node.height) / 2
            boxes[node.step] = Box(node.x - node.width / 2, top, node.width, node.height)

    # back edges: lanes to the right of every box of the layers they span
    lanes: dict[int, float] = {}
    for lane, index in enumerate(sorted(back)):
        edge = edges[index]
        low, high = sorted((layer[edge.source], layer[edge.target]))
        rightmost = max(node.x + node.width / 2 for node in nodes if low <= node.layer <= high)
        lanes[index] = rightmost + NODE_GAP / 2 + lane * BACK_LANE

    # ports: several edges leaving (entering) one box are spread along its bottom (top)
    out_ports: dict[str, list[tuple[float, int]]] = {step_id: [] for step_id in plan.steps}
    in_ports: dict[str, list[tuple[float, int]]] = {step_id: [] for step_id in plan.steps}
    for index, edge in enumerate(edges):
        if index in back:
            out_ports[edge.source].append((lanes[index], index))
            in_ports[edge.target].append((lanes[index], index))
        else:
            chain = chains[index]
            out_ports[edge.source].append((nodes[chain[1]].x, index))
            in_ports[edge.target].append((nodes[chain[-2]].x, index))
    out_x: dict[int, float] = {}
    in_x: dict[int, float] = {}
    for ports, found in ((out_ports, out_x), (in_ports, in_x)):
        for step_id, items in ports.items():
            kind = plan.steps[step_id].kind
            box = boxes[step_id]
            spacing = _PORT_SPACING.get(kind, _DEFAULT_PORT_SPACING)
            spacing = min(spacing, box.w * 0.8 / max(len(items), 1))
            items.sort()
            for offset, (_, index) in zip(_spread(len(items), spacing), items, strict=True):
                found[index] = box.cx + offset

    routes: list[Route] = []
    back_number = {index: number for number, index in enumerate(sorted(back))}
    for index, edge in enumerate(edges):
        source, target = boxes[edge.source], boxes[edge.target]
        if index in back:
            lane_x = lanes[index]
            shift_y = (back_number[index] % 4) * 4.0
            below = row_top[layer[edge.source]] + row_height[layer[edge.source]] + 10 + shift_y
            above = row_top[layer[edge.target]] - 12 - shift_y
            points = (
                (out_x[index], source.bottom),
                (out_x[index], below),
                (lane_x, below),
                (lane_x, above),
                (in_x[index], above),
                (in_x[index], target.y),
            )
            routes.append(Route(edge, points, True, (lane_x + 4, (below + above) / 2), "start"))
            continue
        chain = chains[index]
        pts: list[tuple[float, float]] = [(out_x[index], source.bottom)]
        for key in chain[1:-1]:
            node = nodes[key]
            pts.append((node.x, row_top[node.layer]))
            pts.append((node.x, row_top[node.layer] + row_height[node.layer]))
        pts.append((in_x[index], target.y))
        (x1, y1), (x2, y2) = pts[0], pts[1]
        routes.append(Route(edge, tuple(pts), False, ((x1 + x2) / 2, (y1 + y2) / 2), "middle"))

    width = max(
        [box.right for box in boxes.values()]
        + [route.label_at[0] + label_width(route.edge.label) for route in routes if route.back]
        + [lane + 4 for lane in lanes.values()]
    )
    height = max(box.bottom for box in boxes.values())
    return Layout(width + MARGIN, height + MARGIN, boxes, routes, dict(layer))
