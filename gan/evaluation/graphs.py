"""Pictures of the autograd graphs of one training step: what ``backward()`` walks from the D loss and
from the G loss (``python -m gan.patterns graph``; the G loss's picture also goes to every run's
TensorBoard, gan/training/outputs.py's Samples).

A loss's graph is read as backward reads it: from ``loss.grad_fn`` along ``next_functions`` down to
one ``AccumulateGrad`` node per leaf that requires grad -- here the parameters, named as in
``named_parameters()`` (``G.net.0.weight``). A tensor that needs no gradient has no node at all: its
slot in ``next_functions`` is None. Two such tensors are what the GAN step is about, and the pictures
show them where an operation holds them (saved for its backward; found by their storage):

* in the D loss, ``fake.detach()``: G's output, cut from G's graph -- backward stops there;
* in the G loss, D's frozen weights (``requires_grad=False``): D's operations hold them to pass the
  gradient on to ``fake``, but they are no leaves, so no gradient is computed for them.

Whose operation is whose is read from the tensors each module took in and put out, recorded by
forward hooks (:class:`ForwardRecorder`): a module's operations are those its outputs reach and its
inputs do not; the others belong to neither (the loss, augmentation).
"""

from __future__ import annotations

import io
import shutil
import subprocess
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from PIL import Image
from torch import Tensor, nn

OWNER_COLOURS = {"G": ("#dbe9f6", "#2b6cb0"), "D": ("#fde3c8", "#c05621"), "": ("#f2f2f2", "#707070")}
PARAMETER_FILL = {"G": "#9cc3e6", "D": "#f6b27a"}
CUT_COLOUR = "#c53030"
LEGEND = ("blue: G    orange: D    grey: neither (the loss; augmentation)\n"
          "solid arrows: the path of backward, from the loss down to the parameters (AccumulateGrad)    "
          "dotted: a tensor an operation holds for its backward but sends no gradient to")


@dataclass(frozen=True)
class Node:
    """One box of a picture.

    ``kind``: ``tensor`` (the loss, or samples: where backward starts), ``op`` (an autograd node),
    ``parameter`` (a leaf: its AccumulateGrad node), ``held`` (a tensor without gradient held by an
    op: an input, or a frozen weight) or ``cut`` (a module's output, detached before another module
    took it in). ``owner``: ``G``, ``D`` or ``""`` (neither).
    """

    name: str
    kind: str
    owner: str = ""
    detail: str = ""


@dataclass
class Graph:
    """The graph backward walks from one tensor: nodes in the order of the walk (the tensor first),
    and edges ``(from, to, gradient)`` -- ``gradient`` False for "held, no gradient sent"."""

    title: str
    caption: str
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[tuple[str, str, bool]] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)  # watched modules' parameters that are no leaf here
    owners: tuple[str, ...] = ()  # the watched modules' names, e.g. ("G", "D")

    @property
    def parameters(self) -> set[str]:
        """The parameters backward reaches: the leaves that will get a ``.grad``."""
        return {n.name for n in self.nodes.values() if n.kind == "parameter"}

    def operations(self, owner: str) -> list[str]:
        return [n.name for n in self.nodes.values() if n.kind == "op" and n.owner == owner]

    def held(self, kind: str = "held") -> list[str]:
        return [n.name for n in self.nodes.values() if n.kind == kind]


def storage(t: Tensor) -> int:
    """Where ``t``'s data lives: equal for a tensor, its views and its ``detach()``."""
    return t.untyped_storage().data_ptr()


class ForwardRecorder:
    """Forward hooks on the watched modules (e.g. ``G=G, D=D``): the tensors each takes in and puts
    out, from which :meth:`graph` tells G's operations from D's and finds a detach between them.
    A context manager; leaving it removes the hooks and drops the recorded tensors (and the graphs
    they keep alive)."""

    def __init__(self, **modules: nn.Module):
        self.modules = modules
        self.inputs: dict[str, list[Tensor]] = {owner: [] for owner in modules}
        self.outputs: dict[str, list[Tensor]] = {owner: [] for owner in modules}
        self.handles = [m.register_forward_hook(partial(self.record, owner)) for owner, m in modules.items()]

    def record(self, owner: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.inputs[owner].extend(a for a in args if isinstance(a, Tensor) and a.is_floating_point())
        self.outputs[owner].append(output)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.inputs.clear()
        self.outputs.clear()

    def __enter__(self) -> ForwardRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def graph(self, title: str, tensor: Tensor, caption: str = "", known: Mapping[str, Tensor] | None = None
              ) -> Graph:
        """The graph backward would walk from ``tensor`` now (call it before that backward: a backward
        frees what the operations held). ``known`` names inputs, e.g. ``{"real": real, "z": z}``."""
        names = {id(p): (f"{owner}.{name}", owner, p)
                 for owner, m in self.modules.items() for name, p in m.named_parameters()}
        graph = Graph(title, caption, owners=tuple(self.modules))
        graph.nodes["tensor"] = Node(title, "tensor")
        if tensor.grad_fn is None:
            graph.absent = [name for name, _, _ in names.values()]
            return graph

        # The walk: one key per autograd node, in the order backward meets them from the top.
        keys: dict[Any, str] = {}
        todo = deque([tensor.grad_fn])
        while todo:
            node = todo.popleft()
            if node in keys:
                continue
            variable = getattr(node, "variable", None)  # set on AccumulateGrad nodes only
            keys[node] = names[id(variable)][0] if id(variable) in names else f"op{len(keys)}"
            todo.extend(n for n, _ in node.next_functions if n is not None)
        graph.edges.append(("tensor", keys[tensor.grad_fn], True))

        # A module's operations lie between its outputs and its inputs: reached from the outputs, not
        # from the inputs (D's outputs reach augmentation and G's operations too, through ``fake``).
        def part(owner: str) -> set[Any]:
            ends = [t.grad_fn for t in self.outputs[owner] if t.grad_fn in keys]
            starts = [t.grad_fn for t in self.inputs[owner] if t.grad_fn in keys]
            return reachable(ends) - reachable(starts)

        parts = {owner: part(owner) for owner in self.modules}
        for node, key in keys.items():
            if key in graph.nodes:  # a parameter's AccumulateGrad node: already placed
                continue
            variable = getattr(node, "variable", None)
            if id(variable) in names:
                name, owner, p = names[id(variable)]
                graph.nodes[key] = Node(name, "parameter", owner, str(tuple(p.shape)))
            else:
                owner = next((owner for owner, ops in parts.items() if node in ops), "")
                graph.nodes[key] = Node(type(node).__name__, "op", owner)
            graph.edges.extend((key, keys[n], True) for n, _ in node.next_functions if n is not None)

        reached = graph.parameters
        graph.absent = [name for name, _, _ in names.values() if name not in reached]
        self.mark_held(graph, keys, names, known or {})
        return graph

    def mark_held(self, graph: Graph, keys: dict[Any, str], names: dict[int, tuple[str, str, Tensor]],
                  known: Mapping[str, Tensor]) -> None:
        """Add the tensors without gradient that operations hold: each module's inputs that need no
        gradient (a detached output of another module is a cut) and the parameters that are no leaf.
        ``known`` names some of them (e.g. ``{"real": real}``); the others are named by their role."""
        outputs = {storage(o): owner for owner, outs in self.outputs.items() for o in outs}
        known_names = {storage(t): name for name, t in known.items()}
        candidates: dict[int, Node] = {}
        for owner, tensors in self.inputs.items():
            for t in tensors:
                source = outputs.get(storage(t))
                if source is not None and source != owner:
                    candidates[storage(t)] = Node(f"{source}'s output, detached", "cut", source, f"input of {owner}")
                else:
                    candidates[storage(t)] = Node(known_names.get(storage(t), f"input of {owner}"), "held", owner,
                                                  f"input of {owner}" if storage(t) in known_names else "")
        for name, owner, p in names.values():
            if name in graph.absent:
                candidates[storage(p)] = Node(name, "held", owner, "frozen" if not p.requires_grad else "")

        for node, key in keys.items():
            # Only a node with an empty slot can hold an input that has no edge; and what it holds
            # without gradient does not require grad (a view of ``fake`` held by D in the G loss does).
            if not any(n is None for n, _ in node.next_functions):
                continue
            for t in saved_tensors(node):
                held = candidates.get(storage(t))
                if held is not None and not t.requires_grad:
                    graph.nodes.setdefault(held.name, held)
                    if (key, held.name, False) not in graph.edges:
                        graph.edges.append((key, held.name, False))


# --- the training step's graphs ----------------------------------------------------------------------------




# --- text --------------------------------------------------------------------------------------------------


def describe(node: Node) -> str:
    if node.kind == "tensor":
        return node.name
    if node.kind == "op":
        return f"{node.name}  [{node.owner or 'neither'}]"
    if node.kind == "parameter":
        return f"{node.name} {node.detail}  [leaf: AccumulateGrad]"
    detail = f" ({node.detail})" if node.detail else ""
    if node.kind == "cut":
        return f"{node.name}{detail}  [held, no grad_fn: the cut, backward stops here]"
    return f"{node.name}{detail}  [held, no gradient]"


def text_tree(graph: Graph) -> str:
    """The graph as an indented tree from its tensor down; a node met again is named, not repeated."""
    children: dict[str, list[tuple[str, bool]]] = {}
    for a, b, gradient in graph.edges:
        children.setdefault(a, []).append((b, gradient))
    lines = [f"{graph.title}: {graph.caption}"]
    shown: set[str] = set()

    def visit(key: str, prefix: str, branch: str, gradient: bool) -> None:
        node = graph.nodes[key]
        again = key in shown and node.kind not in ("held", "cut")
        lines.append(f"{prefix}{branch}{'' if gradient else '(held) '}{describe(node)}"
                     f"{'  (shown above)' if again else ''}")
        if again:
            return
        shown.add(key)
        below = children.get(key, [])
        inner = prefix + ("    " if branch in ("`-- ", "") else "|   ")
        for i, (child, grad) in enumerate(below):
            visit(child, inner, "`-- " if i == len(below) - 1 else "|-- ", grad)

    visit("tensor", "", "", True)
    if len(graph.nodes) == 1:
        lines[-1] += "  [grad_fn None: no graph]"
    lines.append(summary(graph))
    return "\n".join(lines)


def reached_counts(graph: Graph) -> str:
    """How many of each watched module's parameters the graph reaches: ``G 8/8, D 0/7``."""
    if len(graph.nodes) == 1:
        return "none (no graph)"
    names = [*graph.parameters, *graph.absent]
    return ", ".join(f"{owner} {sum(n.startswith(owner + '.') for n in graph.parameters)}"
                     f"/{sum(n.startswith(owner + '.') for n in names)}" for owner in graph.owners)


def summary(graph: Graph) -> str:
    """The parameters the graph reaches, and those it does not."""
    absent = f"; no leaf: {', '.join(graph.absent)}" if graph.absent and len(graph.nodes) > 1 else ""
    return f"parameters reached: {reached_counts(graph)}{absent}"


# --- pictures (Graphviz) -------------------------------------------------------------------------------------


def dot_path() -> str | None:
    """Graphviz's ``dot`` (``apt-get install graphviz``), or None where it is not installed."""
    return shutil.which("dot")


def quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def caption(graph: Graph, per_line: int = 4) -> str:
    """A panel's caption: what was run, and which parameters the graph reaches (and which not)."""
    if len(graph.nodes) == 1:
        return f"{graph.caption}\n{graph.title}.grad_fn is None: no graph at all"
    lines = [graph.caption, f"parameters reached: {reached_counts(graph)}"]
    if graph.absent:
        rows = [", ".join(graph.absent[i:i + per_line]) for i in range(0, len(graph.absent), per_line)]
        lines += ["no leaf for: " + rows[0], *rows[1:]]
    return "\n".join(lines)


def dot_node(key: str, node: Node) -> str:
    fill, line = OWNER_COLOURS[node.owner]
    attrs: dict[str, str] = {"fillcolor": fill, "color": line}
    if node.kind == "tensor":
        attrs.update(label=node.name, shape="ellipse", fillcolor="white", color="black", penwidth="1.5")
    elif node.kind == "op":
        attrs.update(label=node.name, style="rounded,filled")
    elif node.kind == "parameter":
        attrs.update(label=f"{node.name}\n{node.detail}", fillcolor=PARAMETER_FILL[node.owner], penwidth="1.5")
    elif node.kind == "cut":
        attrs.update(label=f"{node.name}\n{node.detail}: no grad_fn\nthe cut: backward stops here",
                     style="dashed,filled", fillcolor="white", color=CUT_COLOUR, fontcolor=CUT_COLOUR, penwidth="2")
    else:
        attrs.update(label=f"{node.name}\n{node.detail + ': ' if node.detail else ''}no gradient",
                     style="dashed,filled", fillcolor="white", fontcolor="#505050")
    return f"    {quoted(key)} [{', '.join(f'{k}={quoted(v)}' for k, v in attrs.items())}];"


def to_dot(graphs: Sequence[Graph], title: str) -> str:
    """DOT text drawing ``graphs`` side by side, each in its own box, under ``title``."""
    lines = ["digraph autograd {",
             f"  graph [label={quoted(title + chr(10) + LEGEND)}, labelloc=t, fontsize=13, fontname=\"DejaVu Sans\", "
             "nodesep=0.15, ranksep=0.25, dpi=80];",
             '  node [shape=box, style=filled, fontname="DejaVu Sans", fontsize=10, height=0.3];',
             '  edge [arrowsize=0.6, color="#404040"];']
    for i, graph in enumerate(graphs):
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(f"    graph [label={quoted(caption(graph))}, style=rounded, color=\"#a0a0a0\", fontsize=11];")
        lines += [dot_node(f"{i}:{key}", node) for key, node in graph.nodes.items()]
        for a, b, gradient in graph.edges:
            style = "" if gradient else ' [style=dotted, color="#808080", arrowhead=none]'
            lines.append(f"    {quoted(f'{i}:{a}')} -> {quoted(f'{i}:{b}')}{style};")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw(dot_text: str, fmt: str) -> bytes:
    """``dot_text`` drawn by Graphviz's ``dot`` as ``fmt`` (png, svg)."""
    return subprocess.run(["dot", f"-T{fmt}"], input=dot_text.encode(), check=True, capture_output=True,
                          timeout=120).stdout


def picture(graphs: Sequence[Graph], title: str) -> np.ndarray:
    """``graphs`` drawn side by side, as an (H, W, 3) uint8 image (e.g. for TensorBoard)."""
    return np.asarray(Image.open(io.BytesIO(draw(to_dot(graphs, title), "png"))).convert("RGB"))


# --- python -m gan.patterns graph ------------------------------------------------------------------------------


def saved_tensors(node: Any) -> Iterator[Tensor]:
    """The tensors an autograd node still holds for its backward.

    Each node exposes what it saved as ``_saved_<name>`` attributes (PyTorch's autograd notes, "Saved
    tensors"); reading one that a backward without ``retain_graph`` has freed raises, so freed ones
    are skipped.
    """
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except RuntimeError:  # freed by the backward
            continue
        yield from (t for t in (value if isinstance(value, (tuple, list)) else (value,)) if isinstance(t, Tensor))


def reachable(starts: Iterable[Any], stop: Any = None) -> set[Any]:
    """Every autograd node reachable from ``starts`` along ``next_functions``, the starts included,
    not walking into ``stop``."""
    seen: set[Any] = set()
    todo = [s for s in starts if s is not None]
    while todo:
        node = todo.pop()
        if node is not stop and node not in seen:
            seen.add(node)
            todo.extend(n for n, _ in node.next_functions if n is not None)
    return seen
