"""Fixes of an in-place report that no single changed line makes, as hunks (``Patch`` with ``end``).

Each edit is read from the program's source and is only a guess until a run of the patched copy
shows it works, so the report offers them as candidates that ``--verify-fix`` runs:

- a statement that writes between a forward pass and its backward (an optimiser step, a ``.data``
  write, an assignment to a parametrized tensor) moved to just after the backward call that follows
  it in the same block; a write in a hook function moved out of the hook, after the backward that ran it;
- two backward calls on one graph, the first keeping it for the second, made one
  ``torch.autograd.backward([a, b])``, so a step run per parameter during backward (optimizer in
  backward) runs once every use of the parameter has its gradient;
- ``x = x.clone()`` before a slice or mask assignment into ``x``, so the write changes a copy and not the
  tensor whose view autograd saved;
- the saved operand copied where it is used (``a * b.scale.clone()``), when the write that changed it is
  somewhere else (a buffer a checkpointed block updates again when it is recomputed).
"""

from __future__ import annotations

import ast
import linecache
import os

from .fixes import strip_comment
from .report import Patch, Site
from .source import single_line, statement_at

_BACKWARD_CALLS = ("backward", "grad")  # ``x.backward()``, ``torch.autograd.backward(...)``, ``autograd.grad``
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def parsed_source(path: str) -> tuple[ast.Module, list[str]] | None:
    """The module's syntax tree and its lines, as the program ran them (``linecache``)."""
    lines = linecache.getlines(path)
    try:
        return ast.parse("".join(lines)), lines
    except (SyntaxError, ValueError):
        return None


def call_receiver(call: ast.expr) -> ast.expr:
    """``x`` of ``x.a_(...).b_(...)``."""
    while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
        call = call.func.value
    return call


def _first_line(statement: ast.stmt) -> int:
    decorators = getattr(statement, "decorator_list", [])
    return min([statement.lineno, *(decorator.lineno for decorator in decorators)])


def _bodies(statement: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested directly in ``statement``."""
    bodies = [getattr(statement, name, None) for name in ("body", "orelse", "finalbody")]
    bodies += [handler.body for handler in getattr(statement, "handlers", [])]
    return [body for body in bodies if isinstance(body, list) and body and isinstance(body[0], ast.stmt)]


def _chain(tree: ast.Module, line: int) -> list[tuple[list[ast.stmt], int]]:
    """Each block around ``line``, outermost first: the statement list and the index of the statement in it."""
    chain: list[tuple[list[ast.stmt], int]] = []
    bodies = [tree.body]
    while bodies:
        found = next(((body, index) for body in bodies for index, statement in enumerate(body)
                      if _first_line(statement) <= line <= (statement.end_lineno or statement.lineno)), None)
        if found is None:
            break
        chain.append(found)
        bodies = _bodies(found[0][found[1]])
    return chain


def _calls_backward(statement: ast.stmt) -> bool:
    """Whether the statement (not a definition) calls ``.backward(...)`` or ``autograd.grad(...)``."""
    if isinstance(statement, (*_FUNCTIONS, ast.ClassDef)):
        return False
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in _BACKWARD_CALLS
               and (node.func.attr == "backward" or ast.unparse(node.func).endswith("autograd.grad"))
               for node in ast.walk(statement))


def _lines(lines: list[str], first: int, last: int) -> list[str]:
    return [line.rstrip("\n") for line in lines[first - 1 : last]]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _reindented(block: list[str], old: str, new: str) -> list[str]:
    """``block``, whose first line is indented by ``old``, indented by ``new`` instead."""
    return [new + line[len(old):] if line.startswith(old) else line for line in block]


def _local_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    arguments = function.args
    names = {arg.arg for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
    names |= {arg.arg for arg in (arguments.vararg, arguments.kwarg) if arg is not None}
    stored = {node.id for node in ast.walk(function) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    return names | stored


def move_after_backward(site: Site, root: str, out_of_hook: bool) -> Patch | None:
    """The statement that wrote at ``site`` moved to just after the backward call that follows it.

    The statement moved is the one in the same block as that backward call (the whole ``for`` loop
    that clips each parameter). With ``out_of_hook`` (the write ran during backward, in a hook) the
    statement may leave the function it is in, when it uses none of the function's own names; the
    function is left with ``pass`` if nothing else remains in it.
    """
    parsed = parsed_source(os.path.join(root, site.file))
    if parsed is None:
        return None
    tree, lines = parsed
    chain = _chain(tree, site.line)
    for depth in range(len(chain) - 1, -1, -1):
        body, index = chain[depth]
        backward = next((statement for statement in body[index + 1:] if _calls_backward(statement)), None)
        if backward is not None:
            break
    else:
        return None
    outer = body[index]
    emptied = False
    if isinstance(outer, _FUNCTIONS):
        if not out_of_hook or depth + 1 >= len(chain) or chain[depth + 1][0] is not outer.body:
            return None
        inner_body, inner_index = chain[depth + 1]
        moved = inner_body[inner_index]
        used = {node.id for node in ast.walk(moved) if isinstance(node, ast.Name)}
        if used & _local_names(outer) or isinstance(moved, (*_FUNCTIONS, ast.ClassDef, ast.Return)):
            return None
        emptied = len(outer.body) == 1
    elif isinstance(outer, ast.ClassDef):
        return None
    else:
        moved = outer
    first, last = _first_line(moved), moved.end_lineno or moved.lineno
    block = _lines(lines, first, last)
    old_indent, new_indent = _indent(block[0]), _indent(lines[backward.lineno - 1])
    kept = [old_indent + "pass"] if emptied else []
    between = _lines(lines, last + 1, backward.end_lineno or backward.lineno)
    stepped = _stepped(moved)
    if stepped is not None and moved is outer:
        crossed = body[index + 1 : body.index(backward) + 1]
        for line, changed in _backward_to_own_parameters(tree, lines, body, crossed, stepped).items():
            between[line - last - 1] = changed
    code = "\n".join([*kept, *between, *_reindented(block, old_indent, new_indent)])
    return Patch(site.file, first, code, backward.end_lineno or backward.lineno)


def _stepped(statement: ast.stmt) -> str | None:
    """``opt`` of a statement ``opt.step()``."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        function = statement.value.func
        if isinstance(function, ast.Attribute) and function.attr == "step" and isinstance(function.value, ast.Name):
            return function.value.id
    return None


def _parameters_of(tree: ast.Module, optimiser: str) -> str | None:
    """``list(net.parameters())`` for an optimiser made as ``optimiser = Optimizer(net.parameters(), ...)``."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == optimiser and isinstance(node.value, ast.Call) and node.value.args):
            made_from = node.value.args[0]
            if (isinstance(made_from, ast.Call) and isinstance(made_from.func, ast.Attribute)
                    and made_from.func.attr == "parameters" and not made_from.args and not made_from.keywords):
                return f"list({ast.unparse(made_from)})"
    return None


def _backward_to_own_parameters(tree: ast.Module, lines: list[str], body: list[ast.stmt], crossed: list[ast.stmt],
                                stepped: str) -> dict[int, str]:
    """``loss.backward(inputs=list(net.parameters()))`` for each ``loss.backward()`` among the ``crossed``
    statements of ``body`` (those the step of ``stepped`` moves past) that another optimiser's step follows,
    by line.

    Moved after such a backward, the step would also apply that loss's gradient of its own parameters
    (a GAN's discriminator stepping on the generator's loss); ``inputs`` keeps the backward to the
    parameters of the optimiser that steps on it, as the original order had it.
    """
    changed = {}
    for statement in crossed:
        call = _backward_of_name(statement)
        if call is None or call[1] or statement.lineno != statement.end_lineno:
            continue
        following = (_stepped(later) for later in body[body.index(statement) + 1:])
        owner = next((name for name in following if name is not None and name != stepped), None)
        parameters = _parameters_of(tree, owner) if owner is not None else None
        if parameters is not None:
            text = lines[statement.lineno - 1].rstrip("\n")
            column = (statement.value.end_col_offset or 0) - 1  # before the call's closing parenthesis
            changed[statement.lineno] = f"{text[:column]}inputs={parameters}{text[column:]}"
    return changed


def _backward_of_name(statement: ast.stmt) -> tuple[str, list[ast.keyword]] | None:
    """``("loss", keywords)`` for a statement ``loss.backward(...)``."""
    if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
        return None
    call = statement.value
    if not isinstance(call.func, ast.Attribute) or call.func.attr != "backward" or call.args:
        return None
    if not isinstance(call.func.value, ast.Name):
        return None
    return call.func.value.id, call.keywords


def _imports_torch(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Import) and any(alias.name == "torch" and alias.asname is None
                                                    for alias in node.names) for node in tree.body)


def merge_backward_calls(file: str, root: str) -> Patch | None:
    """``a.backward(retain_graph=True)`` followed by ``b.backward()`` as one ``torch.autograd.backward([a, b])``.

    Two passes over one graph run a per-parameter step (a hook) after the first pass, while the second
    still needs the parameters; one pass over both roots gives each parameter its summed gradient first.
    """
    parsed = parsed_source(os.path.join(root, file))
    if parsed is None or not _imports_torch(parsed[0]):
        return None
    tree, lines = parsed
    blocks = [tree.body, *(body for node in ast.walk(tree) if isinstance(node, ast.stmt) for body in _bodies(node))]
    for body in blocks:
        for first, second in zip(body, body[1:]):
            calls = _backward_of_name(first), _backward_of_name(second)
            if calls[0] is None or calls[1] is None or calls[1][1]:
                continue
            retained = [keyword for keyword in calls[0][1] if keyword.arg == "retain_graph"]
            if len(calls[0][1]) != 1 or not retained or ast.unparse(retained[0].value) != "True":
                continue
            code = f"{_indent(lines[first.lineno - 1])}torch.autograd.backward([{calls[0][0]}, {calls[1][0]}])"
            return Patch(file, first.lineno, code, second.end_lineno or second.lineno)
    return None


def clone_before_write(site: Site, root: str) -> Patch | None:
    """``x = x.clone()`` before the slice or mask assignment ``x[...] = value`` at ``site``."""
    parsed = parsed_source(os.path.join(root, site.file))
    if parsed is None:
        return None
    tree, lines = parsed
    statement = statement_at(tree, site.line)
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return None
    target = statement.targets[0]
    if not isinstance(target, ast.Subscript) or not isinstance(target.value, ast.Name):
        return None
    code = single_line(statement, lines)
    if code is None:
        return None
    name, indent = target.value.id, _indent(lines[statement.lineno - 1])
    return Patch(site.file, statement.lineno, f"{indent}{name} = {name}.clone()\n{indent}{code}", statement.lineno)


def _written_name(site: Site, root: str) -> str | None:
    """The last name of the tensor the statement at ``site`` writes in place: ``scale`` of ``self.scale.mul_(...)``."""
    parsed = parsed_source(os.path.join(root, site.file))
    statement = statement_at(parsed[0], site.line) if parsed is not None else None
    if not isinstance(statement, ast.Expr):
        return None
    written = call_receiver(statement.value)
    if isinstance(written, ast.Attribute):
        return written.attr
    return written.id if isinstance(written, ast.Name) else None


def clone_saved_operand(saved_by: Site, modified_by: Site, root: str) -> Patch | None:
    """The saving line with ``.clone()`` after its one operand that names the tensor ``modified_by`` wrote."""
    name = _written_name(modified_by, root)
    parsed = parsed_source(os.path.join(root, saved_by.file))
    if name is None or parsed is None:
        return None
    tree, lines = parsed
    statement = statement_at(tree, saved_by.line)
    if statement is None or single_line(statement, lines) is None:
        return None
    operands = [node for node in ast.walk(statement)
                if isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Load)
                or isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)]
    if len(operands) != 1:
        return None
    text = lines[statement.lineno - 1]
    column = operands[0].end_col_offset or 0
    return Patch(saved_by.file, saved_by.line, strip_comment((text[:column] + ".clone()" + text[column:]).strip()))
