"""Compile a CEL selector into Python closures, and find which device fields it reads.

cel-python 0.5.0 parses (its lark grammar and `CELParser`); we do not use its evaluator: it costs
~200 us for a two-clause selector (it clones activations and rebuilds typing casts on every
node), offers no hook to bound cost, reports unknown functions only at runtime, and its
transpiler fails on 0.5.0 (`Tree has no attribute checked_exception`). Instead each AST node
becomes a closure `Frame -> value` over the runtime in cel_values/cel_library/cel_macros, so a
selector evaluates in a few microseconds and every call and loop step is metered.

What is checked here, as cel-go's checker would: identifiers (only `device`, loop and bind
variables, type names), function names and argument counts, `device` fields, `has()` arguments,
literal ranges, constant regular expressions, nesting depth, and that the result can be a bool.

While compiling, every access path rooted at `device` (`device.driver`,
`device.attributes["d"].id`, `device.capacity["d"]`, ...) is recorded; `Reads` lists the maximal
ones so a selector's result can be memoised per device *profile* (see cel.py).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lark
from celpy.celparser import CELParseError, CELParser
from celpy.evaluation import celbytes, celstr

from services.cel import macros
from services.cel.lib_strings import regex
from services.cel.library import FUNCTIONS, METHODS, UNSUPPORTED
from services.cel.nodes import (
    PASS_THROUGH,
    Branch,
    CompileError,
    Node,
    Reads,
    Tree,
    bare_ident,
    charged_select,
    const,
    contains,
    extendable,
    fold,
    invoke,
    parse_integer,
    trailing,
    unwrap,
    where,
)
from services.cel.values import (
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    CelType,
    DeviceValue,
    EvalError,
    Frame,
    Function,
    Uint,
    add,
    divide,
    equal,
    index,
    modulo,
    multiply,
    negate,
    no_overload,
    ordered,
    subtract,
    type_name,
)

__all__ = ["DEVICE_SLOT", "CompileError", "Program", "Reads", "compile_expression"]

Eval = macros.Eval
DEVICE_SLOT = "@device"  # not an identifier, so a loop variable named `device` cannot clobber it
MAX_DEPTH = 100  # far beyond real selectors; keeps compile and evaluation off the recursion limit
_DEVICE_FIELDS = {"driver": "string", "attributes": "map", "capacity": "map"}
_TYPE_IDENTS = ("int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type")
_PARSE_LOCK = threading.Lock()
_CEL_TYPE_NAMES = {
    "device": "kubernetes.DRADevice",
    "quantity": "kubernetes.Quantity",
    "semver": "kubernetes.Semver",
}


@dataclass(frozen=True)
class Program:
    run: Eval
    reads: Reads
    result_type: str | None


def compile_expression(expression: str, *, allow_multiple_allocations_field: bool) -> Program:
    """Parse and compile; raises CompileError."""
    try:
        with _PARSE_LOCK:
            tree = CELParser().parse(expression)
    except CELParseError as exc:
        where = f" at {exc.line}:{exc.column}" if exc.line else ""
        context = str(exc.args[0]).strip() if exc.args else ""
        raise CompileError(f"Syntax error{where}: {context}") from None
    compiler = _Compiler(allow_multiple_allocations_field)
    try:
        node = compiler.compile(tree)
    except RecursionError:
        raise CompileError(f"expression nests deeper than {MAX_DEPTH} levels") from None
    if node.type not in (None, "bool"):
        kind = _CEL_TYPE_NAMES.get(node.type, node.type)
        raise CompileError(f"must evaluate to bool or the unknown type, not {kind}")
    return Program(node.run, compiler.reads(), node.type)


_RELATIONS: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {
    "relation_lt": ("_<_", operator.lt),
    "relation_le": ("_<=_", operator.le),
    "relation_gt": ("_>_", operator.gt),
    "relation_ge": ("_>=_", operator.ge),
}
_ARITHMETIC: dict[str, Callable[[Frame, Any, Any], Any]] = {
    "addition_add": add,
    "addition_sub": subtract,
    "multiplication_mul": multiply,
    "multiplication_div": divide,
    "multiplication_mod": modulo,
}


class _Compiler:
    def __init__(self, allow_multiple_allocations_field: bool) -> None:
        self.device_fields = dict(_DEVICE_FIELDS)
        if allow_multiple_allocations_field:
            self.device_fields["allowMultipleAllocations"] = "bool"
        self.scope: list[str] = []
        self.paths: list[Node] = []
        self.extended: set[int] = set()
        self.depth = 0

    # --- dispatch -------------------------------------------------------------------

    def compile(self, branch: Branch) -> Node:
        if not isinstance(branch, lark.Tree):
            raise CompileError(f"unexpected token {branch!r}{where(branch)}")
        tree = branch
        while tree.data in PASS_THROUGH and len(tree.children) == 1:
            child = tree.children[0]
            if not isinstance(child, lark.Tree):
                break
            tree = child
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CompileError(f"expression nests deeper than {MAX_DEPTH} levels")
        try:
            handler = getattr(self, "_" + str(tree.data), None)
            if handler is None:
                raise CompileError(f"unsupported syntax '{tree.data}'{where(tree)}")
            node: Node = handler(tree)
            return node
        finally:
            self.depth -= 1

    def _expr(self, tree: Tree) -> Node:
        cond, yes, no = (self.compile(c) for c in tree.children)
        cond_run, yes_run, no_run = cond.run, yes.run, no.run

        def run(frame: Frame) -> Any:
            test = cond_run(frame)
            if test is True:
                return yes_run(frame)
            if test is False:
                return no_run(frame)
            raise no_overload("_?_:_", test)

        return Node(run, yes.type if yes.type == no.type else None)

    def _conditionalor(self, tree: Tree) -> Node:
        return self._logic(tree, decisive=True, name="_||_")

    def _conditionaland(self, tree: Tree) -> Node:
        return self._logic(tree, decisive=False, name="_&&_")

    def _logic(self, tree: Tree, *, decisive: bool, name: str) -> Node:
        left_run, right_run = (self.compile(c).run for c in tree.children)

        def run(frame: Frame) -> bool:
            left: Any
            right: Any
            try:
                left = left_run(frame)
            except EvalError as exc:
                left = exc
            if type(left) is bool and left == decisive:
                return left
            try:
                right = right_run(frame)
            except EvalError as exc:
                right = exc
            if type(right) is bool and right == decisive:
                return right
            if type(left) is bool and type(right) is bool:
                return not decisive
            for side in (left, right):
                if isinstance(side, EvalError):
                    raise side
            raise no_overload(name, left, right)

        return Node(run, "bool")

    # --- operators ------------------------------------------------------------------

    def _relation(self, tree: Tree) -> Node:
        op_tree, right_tree = tree.children
        assert isinstance(op_tree, lark.Tree) and isinstance(right_tree, lark.Tree)
        left, right = self.compile(op_tree.children[0]), self.compile(right_tree)
        left_run, right_run = left.run, right.run
        kind = str(op_tree.data)
        if kind in ("relation_eq", "relation_ne"):
            negated = kind == "relation_ne"

            def run_eq(frame: Frame) -> bool:
                frame.charge(1)
                return equal(left_run(frame), right_run(frame)) is not negated

            return Node(run_eq, "bool")
        if kind == "relation_in":
            node = Node(lambda frame: contains(frame, left_run(frame), right_run(frame)), "bool")
            if extendable(right.path) and type(left.constant) is str:
                self._narrow(node, right, left.constant)  # `"d" in device.attributes`
            return node
        name, compare = _RELATIONS[kind]

        def run(frame: Frame) -> bool:
            left, right = left_run(frame), right_run(frame)
            frame.charge(1)
            ordered(name, left, right)
            return bool(compare(left, right))

        return Node(run, "bool")

    def _arithmetic(self, tree: Tree) -> Node:
        op_tree, right_tree = tree.children
        assert isinstance(op_tree, lark.Tree) and isinstance(right_tree, lark.Tree)
        left = self.compile(op_tree.children[0])
        right = self.compile(right_tree)
        left_run, right_run, apply = left.run, right.run, _ARITHMETIC[str(op_tree.data)]
        same = left.type if left.type == right.type else None
        kind = same if same in ("int", "uint", "double", "string", "bytes", "list") else None
        return Node(lambda frame: apply(frame, left_run(frame), right_run(frame)), kind)

    _addition = _arithmetic
    _multiplication = _arithmetic

    def _unary(self, tree: Tree) -> Node:
        op_tree, operand_tree = tree.children
        assert isinstance(op_tree, lark.Tree) and isinstance(operand_tree, lark.Tree)
        operand = self.compile(operand_tree)
        operand_run = operand.run
        if op_tree.data == "unary_neg":
            return Node(lambda frame: negate(frame, operand_run(frame)), operand.type)

        def run_not(frame: Frame) -> bool:
            value = operand_run(frame)
            if type(value) is not bool:
                raise no_overload("!_", value)
            return not value

        return Node(run_not, "bool")

    # --- member access and calls ----------------------------------------------------

    def _member_dot(self, tree: Tree) -> Node:
        target_tree, name_token = tree.children
        assert isinstance(target_tree, lark.Tree)
        target = self.compile(target_tree)
        name = str(name_token)
        if target.path == ("device",):
            if name not in self.device_fields:
                raise CompileError(f"undefined field '{name}'{where(name_token)}")
            return self._extend(target, name, self.device_fields[name])
        if extendable(target.path):
            return self._extend(target, name, None)
        target_run = target.run
        return Node(lambda frame: charged_select(frame, target_run(frame), name))

    def _member_index(self, tree: Tree) -> Node:
        target_tree, key_tree = tree.children
        assert isinstance(target_tree, lark.Tree) and isinstance(key_tree, lark.Tree)
        target = self.compile(target_tree)
        key = self.compile(key_tree)
        if target.path == ("device",):
            raise CompileError(f"type 'kubernetes.DRADevice' cannot be indexed{where(tree)}")
        if extendable(target.path) and type(key.constant) is str:
            return self._extend(target, key.constant, None)
        target_run, key_run = target.run, key.run

        def run(frame: Frame) -> Any:
            container = target_run(frame)
            key_value = key_run(frame)
            frame.charge(1)
            return index(container, key_value)

        return Node(run)

    def _extend(self, target: Node, key: str, kind: str | None) -> Node:
        """A select/index that continues a `device...` access path."""
        assert target.path is not None
        self.extended.add(id(target))
        path = (*target.path, key)
        if path[1] == "capacity" and len(path) == 4:
            kind = "quantity"
        elif len(path) == 3:
            kind = "map"
        target_run = target.run
        node = Node(lambda frame: charged_select(frame, target_run(frame), key), kind, path)
        self.paths.append(node)
        return node

    def _narrow(self, node: Node, target: Node, key: str) -> None:
        """`node` (an `in` or `has()` test on `target`) only reads `target[key]`."""
        assert target.path is not None
        self.extended.add(id(target))
        node.path = (*target.path, key)
        self.paths.append(node)

    def _member_dot_arg(self, tree: Tree) -> Node:
        target_tree, name_token, *rest = tree.children
        assert isinstance(target_tree, lark.Tree)
        name = str(name_token)
        arg_trees = trailing(rest)
        macro = self._macro(target_tree, name, arg_trees)
        if macro is not None:
            return macro
        namespace = bare_ident(target_tree)
        if namespace is not None and namespace not in self.scope and namespace != "device":
            qualified = f"{namespace}.{name}"
            if qualified == "cel.bind":
                return self._bind(arg_trees, tree)
            if qualified in FUNCTIONS or qualified in UNSUPPORTED:
                return self._call(qualified, FUNCTIONS, arg_trees, tree)
        target = self.compile(target_tree)
        args = [self.compile(a) for a in arg_trees]
        return self._apply(name, METHODS, [target, *args], len(args), tree)

    def _ident_arg(self, tree: Tree) -> Node:
        name_token, *rest = tree.children
        name = str(name_token)
        arg_trees = trailing(rest)
        if name == "has":
            return self._has(arg_trees, tree)
        return self._call(name, FUNCTIONS, arg_trees, tree)

    _dot_ident_arg = _ident_arg

    def _call(self, name: str, table: dict[str, Function], arg_trees: list[Any], tree: Any) -> Node:
        args = [self.compile(a) for a in arg_trees]
        return self._apply(name, table, args, len(args), tree)

    def _apply(
        self, name: str, table: dict[str, Function], args: list[Node], arity: int, tree: Any
    ) -> Node:
        function = table.get(name)
        if function is None:
            if name in UNSUPPORTED:
                raise CompileError(f"function '{name}' is not supported by gpualloc{where(tree)}")
            raise CompileError(f"undeclared reference to '{name}'{where(tree)}")
        if arity not in function.arities:
            raise CompileError(
                f"found no matching overload for '{name}' with {arity} argument(s){where(tree)}"
            )
        self._check_constant_regex(name, args, tree)
        node = Node(invoke(name, function.impl, [a.run for a in args]), function.result)
        if args and all(a.is_constant for a in args):
            return fold(node)
        return node

    def _check_constant_regex(self, name: str, args: list[Node], tree: Any) -> None:
        if name in ("matches", "find", "findAll") and args[1].is_constant:
            pattern = args[1].constant
            if type(pattern) is str:
                try:
                    regex(pattern)
                except EvalError as exc:
                    raise CompileError(f"{exc}{where(tree)}") from None

    # --- macros ---------------------------------------------------------------------

    def _has(self, arg_trees: list[Any], tree: Tree) -> Node:
        selection = unwrap(arg_trees[0]) if len(arg_trees) == 1 else None
        if selection is None or selection.data != "member_dot":
            raise CompileError(f"invalid argument to has() macro{where(tree)}")
        target_tree, name_token = selection.children
        target = self.compile(target_tree)
        name = str(name_token)
        target_run, fields = target.run, self.device_fields

        def run(frame: Frame) -> bool:
            value = target_run(frame)
            frame.charge(1)
            if isinstance(value, dict):
                return name in value
            if type(value) is DeviceValue:
                return name in fields
            raise EvalError(f"invalid type for field selection: {type_name(value)}")

        node = Node(run, "bool")
        if target.path == ("device",) and name not in self.device_fields:
            raise CompileError(f"undefined field '{name}'{where(name_token)}")
        if target.path == ("device",) or extendable(target.path):
            self._narrow(node, target, name)
        return node

    def _macro(self, target_tree: Tree, name: str, arg_trees: list[Any]) -> Node | None:
        variables = [bare_ident(a) for a in arg_trees]
        shapes = {
            "all": (2, 3),
            "exists": (2, 3),
            "exists_one": (2, 3),
            "existsOne": (3,),
            "map": (2, 3),
            "filter": (2,),
            "transformList": (3, 4),
            "transformMap": (3, 4),
        }
        if name not in shapes or len(arg_trees) not in shapes[name]:
            return None
        two = name in ("transformList", "transformMap") or (
            name in ("all", "exists", "exists_one", "existsOne") and len(arg_trees) == 3
        )
        names = variables[:2] if two else variables[:1]
        if any(v is None for v in names):
            raise CompileError(f"{name}() needs identifiers as its loop variables")
        loop_names = [str(v) for v in names]
        target = self.compile(target_tree).run
        self.scope.extend(loop_names)
        try:
            body = [self.compile(a) for a in arg_trees[len(loop_names) :]]
        finally:
            del self.scope[-len(loop_names) :]
        runs = [b.run for b in body]
        if name in ("all", "exists"):
            return Node(macros.quantifier(target, loop_names, runs[0], name == "exists"), "bool")
        if name in ("exists_one", "existsOne"):
            return Node(macros.count_one(target, loop_names, runs[0]), "bool")
        if name == "filter":
            return Node(macros.transform_list(target, loop_names, runs[0], None), "list")
        keep = runs[0] if len(runs) == 2 else None
        if name == "transformMap":
            return Node(macros.transform_map(target, loop_names, keep, runs[-1]), "map")
        return Node(macros.transform_list(target, loop_names, keep, runs[-1]), "list")

    def _bind(self, arg_trees: list[Any], tree: Tree) -> Node:
        name = bare_ident(arg_trees[0]) if len(arg_trees) == 3 else None
        if name is None:
            raise CompileError(f"cel.bind() needs (identifier, init, body){where(tree)}")
        init = self.compile(arg_trees[1])
        self.scope.append(name)
        try:
            body = self.compile(arg_trees[2])
        finally:
            self.scope.pop()
        return Node(macros.bind(name, init.run, body.run), body.type)

    # --- primaries ------------------------------------------------------------------

    def _ident(self, tree: Tree) -> Node:
        name = str(tree.children[0])
        if name in self.scope:
            return Node(lambda frame: frame.vars[name])
        return self._global_ident(name, tree)

    def _dot_ident(self, tree: Tree) -> Node:
        return self._global_ident(str(tree.children[0]), tree)

    def _global_ident(self, name: str, tree: Tree) -> Node:
        if name == "device":
            node = Node(lambda frame: frame.vars[DEVICE_SLOT], "device", ("device",))
            self.paths.append(node)
            return node
        if name in _TYPE_IDENTS or name == "type":
            return const(CelType(name), "type")
        raise CompileError(f"undeclared reference to '{name}'{where(tree)}")

    def _list_lit(self, tree: Tree) -> Node:
        items = [self.compile(c).run for c in trailing(tree.children)]

        def run(frame: Frame) -> list[Any]:
            frame.charge(10)
            return [item(frame) for item in items]

        return Node(run, "list")

    def _map_lit(self, tree: Tree) -> Node:
        flat = [self.compile(c).run for c in trailing(tree.children)]
        entries = list(zip(flat[0::2], flat[1::2], strict=True))

        def run(frame: Frame) -> dict[Any, Any]:
            frame.charge(30)
            result: dict[Any, Any] = {}
            for key_run, value_run in entries:
                key = key_run(frame)
                if type(key) not in (str, int, Uint, bool):
                    raise EvalError(f"unsupported map key type: {type_name(key)}")
                if key in result:
                    raise EvalError(f"Failed with repeated key: {key}")
                result[key] = value_run(frame)
            return result

        return Node(run, "map")

    def _member_object(self, tree: Tree) -> Node:
        raise CompileError(f"message construction is not supported{where(tree)}")

    def _literal(self, tree: Tree) -> Node:
        token = tree.children[0]
        assert isinstance(token, lark.Token)
        kind, text = token.type, str(token)
        if kind in ("STRING_LIT", "MLSTRING_LIT"):
            return const(str(celstr(token)), "string")
        if kind == "BYTES_LIT":
            return const(bytes(celbytes(token)), "bytes")
        if kind == "BOOL_LIT":
            return const(text == "true", "bool")
        if kind == "NULL_LIT":
            return const(None, "null_type")
        if kind == "FLOAT_LIT":
            return const(float(text), "double")
        if kind == "UINT_LIT":
            value = parse_integer(text[:-1], 0, UINT64_MAX, token)
            return const(Uint(value), "uint")
        return const(parse_integer(text, INT64_MIN, INT64_MAX, token), "int")

    # --- results --------------------------------------------------------------------

    def reads(self) -> Reads:
        """What the expression reads of `device`: the access paths no other path extends."""
        return Reads.of([n.path for n in self.paths if id(n) not in self.extended and n.path])
