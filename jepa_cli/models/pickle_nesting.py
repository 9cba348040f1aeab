"""How deep the objects a pickle would build nest, measured from its opcodes before it is unpickled:
unpickling hashes a dict key, and a tuple nested hundreds of thousands deep would overflow the C
stack doing so (models/torch_checkpoint.py checks each checkpoint's pickle with `check_nesting`)."""

from __future__ import annotations

import pickletools
from typing import Any

MAX_NESTING = 100  # containers within containers a pickle may build; a checkpoint nests a handful

# opcodes that pop `n` items and push one object holding them (a tuple, or a call's result)
_BUILD_FROM = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "REDUCE": 2, "NEWOBJ": 2, "NEWOBJ_EX": 3}
_FROM_MARK = {"TUPLE", "LIST", "DICT", "FROZENSET", "OBJ", "INST"}  # pop to the mark, push one object
_INTO_CONTAINER = {"APPEND": 1, "SETITEM": 2, "BUILD": 1}  # pop `n` items into the object below them
_INTO_FROM_MARK = {"APPENDS", "SETITEMS", "ADDITEMS"}  # pop to the mark into the object below it
_EMPTY = {"EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "EMPTY_TUPLE"}


class _Node:
    """An object a pickle builds, as the nesting scan sees it: how deep it nests and what holds it
    (each container, tuple, call or object state it was put in)."""

    __slots__ = ("depth", "holders")

    def __init__(self, depth: int = 0):
        self.depth, self.holders = depth, []


def _hold(holder: _Node, items: list[_Node]) -> None:
    """`holder` now holds `items`: its depth, and that of everything holding it, grows to fit (a
    cycle, as a bound method of an object in the object's own state makes, is followed once).
    ValueError once anything nests deeper than MAX_NESTING."""
    for item in items:
        item.holders.append(holder)
    _deepen(holder, max((item.depth for item in items), default=0) + 1, set())


def _deepen(node: _Node, depth: int, path: set) -> None:
    if depth <= node.depth or node in path:
        return
    if depth > MAX_NESTING:
        raise ValueError(f"its pickle nests containers more than {MAX_NESTING} deep")
    node.depth = depth
    path.add(node)
    for up in node.holders:
        _deepen(up, depth + 1, path)
    path.discard(node)


def check_nesting(data: bytes) -> None:
    """ValueError when the pickle `data` would build an object nested more than MAX_NESTING deep, or is
    malformed; found from its opcodes alone, before anything is unpickled."""
    stack: list[_Node] = []
    marks: list[int] = []  # the stack's length at each MARK not yet popped
    memo: dict[Any, _Node] = {}

    def pop(n: int) -> list[_Node]:
        if len(stack) - n < (marks[-1] if marks else 0):
            raise ValueError("its pickle pops more than it pushed")
        items = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        return items

    def pop_mark() -> list[_Node]:
        if not marks:
            raise ValueError("its pickle pops a mark it never set")
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def top() -> _Node:
        if len(stack) <= (marks[-1] if marks else 0):
            raise ValueError("its pickle uses an object it never pushed")
        return stack[-1]

    for opcode, arg, _pos in pickletools.genops(data):
        name = opcode.name
        if name == "MARK":
            marks.append(len(stack))
        elif name in _EMPTY:
            stack.append(_Node(1))
        elif name in _BUILD_FROM or name in _FROM_MARK:
            node = _Node()
            _hold(node, pop(_BUILD_FROM[name]) if name in _BUILD_FROM else pop_mark())
            stack.append(node)
        elif name in _INTO_CONTAINER or name in _INTO_FROM_MARK:
            items = pop(_INTO_CONTAINER[name]) if name in _INTO_CONTAINER else pop_mark()
            _hold(top(), items)
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo.get(arg) or _Node())
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            memo[len(memo) if name == "MEMOIZE" else arg] = top()
        elif name == "DUP":
            stack.append(top())
        elif name == "POP":
            if len(stack) > (marks[-1] if marks else 0):
                stack.pop()
            else:
                pop_mark()
        elif name == "POP_MARK":
            pop_mark()
        elif name in ("STACK_GLOBAL", "BINPERSID"):
            pop(2 if name == "STACK_GLOBAL" else 1)
            stack.append(_Node())
        elif name in ("PROTO", "FRAME", "STOP", "READONLY_BUFFER"):
            pass
        else:  # every other opcode pushes one number, string, global or persistent object
            stack.append(_Node())
