"""The AWS calls a package's code makes, read from its source (no import, no AWS): the IAM actions a role that
runs it needs. tests/cluster_constructs/test_job_keeper.py compares them with the job keeper's policy.

How a call is found, in the modules of `packages` (the keeper's own and what it imports that may call AWS):

- the functions reached from every function of `entry` (job_keeper): a call of a name resolves through the
  module's own definitions and its `from <package> import` lines; a call of `x.method(...)` reaches every method
  of that name in those modules, and a read of `x.prop` every property of that name (more than the real calls,
  never fewer);
- a boto3 call is `<client>.<operation>(...)` where the receiver's last name is one of `services` (the code
  names its clients after their service: `ssm`, `self.dynamodb`, `self.clients.ec2`); `<client>.get_paginator
  ("op")` calls op; `transact_write_items` is authorized per item (Put, Update, Delete, ConditionCheck), so its
  TransactItems must be written as a literal list;
- the operation maps to `<signing name>:<OperationName>` through botocore's own service model, which also
  proves the operation exists. An operation of one of the services called on a receiver with another name is
  refused: the test could not see which service it is.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import botocore.session
from botocore import xform_name

REPO_ROOT = Path(__file__).resolve().parent.parent
# The item actions inside TransactWriteItems (DynamoDB Developer Guide, "Using IAM with DynamoDB transactions").
TRANSACT_ITEM_ACTIONS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                         "ConditionCheck": "ConditionCheckItem"}
# Calls whose IAM actions depend on their arguments in ways this reader does not follow: refused, so a new one
# makes someone extend it rather than pass unseen.
UNREADABLE = {"transact_get_items", "batch_write_item", "batch_get_item", "execute_transaction",
              "execute_statement", "batch_execute_statement"}


class UnreadableCall(AssertionError):
    """A call whose IAM action the reader cannot tell: one line naming where and why."""


@dataclass
class _Module:
    name: str
    path: Path
    tree: ast.Module
    scope: dict[str, ast.AST] = field(default_factory=dict)  # name -> FunctionDef or ClassDef it refers to


def _modules(packages: Iterable[str], root: Path) -> dict[str, _Module]:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = _Module(name, path, ast.parse(path.read_text(), filename=str(path)))
    for module in modules.values():
        for node in module.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                module.scope[node.name] = node
    for module in modules.values():  # then the names each imports from the others
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                for alias in node.names:
                    target = modules[node.module].scope.get(alias.name)
                    if target is not None:
                        module.scope[alias.asname or alias.name] = target
    return modules


def _receiver_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_property(function: ast.AST) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in getattr(function, "decorator_list", []))


def _operations(services: Iterable[str]) -> dict[str, tuple[str, dict[str, str]]]:
    """service -> (IAM prefix, {snake_case operation: OperationName}) from botocore's service models."""
    session = botocore.session.get_session()
    found = {}
    for service in services:
        model = session.get_service_model(service)
        found[service] = (model.signing_name, {xform_name(op): op for op in model.operation_names})
    return found


def aws_calls(*, packages: Iterable[str], entry: str, services: Iterable[str],
              root: Path = REPO_ROOT) -> dict[str, set[str]]:
    """{IAM action: {"path:line" of each call}} for every AWS call the functions of package `entry` reach."""
    modules = _modules(packages, root)
    operations = _operations(services)
    every_operation = {op: service for service, (_, ops) in operations.items() for op in ops}
    owner: dict[int, _Module] = {}
    methods: dict[str, list[ast.AST]] = {}
    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                owner[id(node)] = module
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        methods.setdefault(item.name, []).append(item)

    calls: dict[str, set[str]] = {}
    pending = [n for m in modules.values() if m.name.split(".")[0] == entry for n in ast.walk(m.tree)
               if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    seen: set[int] = set()

    def reach(target: ast.AST | None) -> None:
        if target is None or id(target) in seen:
            return
        if isinstance(target, ast.ClassDef):  # a construction runs __init__ / __post_init__
            for item in target.body:
                if isinstance(item, ast.FunctionDef) and item.name in ("__init__", "__post_init__"):
                    reach(item)
            return
        pending.append(target)

    def record(service: str, operation: str, where: str) -> None:
        prefix, ops = operations[service]
        if operation not in ops:
            raise UnreadableCall(f"{where}: {service}.{operation} is not an operation of {service}")
        calls.setdefault(f"{prefix}:{ops[operation]}", set()).add(where)

    while pending:
        function = pending.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        module = owner[id(function)]
        for node in ast.walk(function):
            where = f"{module.path.relative_to(root)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                for method in methods.get(node.attr, []):
                    if _is_property(method):
                        reach(method)
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name):
                reach(module.scope.get(node.func.id))
                continue
            if not isinstance(node.func, ast.Attribute):
                continue
            name, receiver = node.func.attr, _receiver_name(node.func.value)
            if receiver in operations:
                if name in UNREADABLE:
                    raise UnreadableCall(f"{where}: {receiver}.{name}: its IAM actions depend on its arguments; "
                                         "teach tests/keeper_calls.py to read them")
                if name == "get_paginator":
                    if not (node.args and isinstance(node.args[0], ast.Constant)):
                        raise UnreadableCall(f"{where}: {receiver}.get_paginator needs the operation as a literal")
                    record(receiver, node.args[0].value, where)
                elif name == "transact_write_items":
                    for item in _transact_items(node, where):
                        calls.setdefault(f"{operations[receiver][0]}:{item}", set()).add(where)
                elif name not in ("close", "can_paginate", "get_waiter"):
                    record(receiver, name, where)
                continue
            if name in every_operation and receiver not in operations:
                raise UnreadableCall(f"{where}: {receiver}.{name}(...) looks like a {every_operation[name]} call on "
                                     f"a client named {receiver!r}: name the client after its service")
            for method in methods.get(name, []):
                reach(method)
    return calls


def _transact_items(call: ast.Call, where: str) -> set[str]:
    """The item actions of a transact_write_items call, from its literal TransactItems."""
    (items,) = [k.value for k in call.keywords if k.arg == "TransactItems"] or [None]
    if not isinstance(items, ast.List) or not all(isinstance(e, ast.Dict) for e in items.elts):
        raise UnreadableCall(f"{where}: transact_write_items needs TransactItems as a literal list of dicts: "
                             "each item is authorized as its own action")
    actions = set()
    for element in items.elts:
        for key in element.keys:
            if not (isinstance(key, ast.Constant) and key.value in TRANSACT_ITEM_ACTIONS):
                raise UnreadableCall(f"{where}: a TransactItems entry with key {ast.unparse(key) if key else '**'}: "
                                     f"allowed: {', '.join(TRANSACT_ITEM_ACTIONS)}")
            actions.add(TRANSACT_ITEM_ACTIONS[key.value])
    return actions
