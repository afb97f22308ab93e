"""A pgbench script's SQL read by PostgreSQL's own parser (libpg_query, through pglast): which
statements are reads, and what each would call on the server.

A statement is a read when it is one of SELECT, VALUES, TABLE, SHOW, EXPLAIN of a read, SET or
RESET of a session setting, or the transaction control that cannot change whether its
transaction may write; and a SELECT is a read when nothing in it (a subquery, a WITH query)
writes, locks rows (`FOR UPDATE`, `FOR SHARE` ...) or makes a table (`SELECT INTO`). What a
read would make the server run is collected, by name, to be resolved on the server
(drive/readonly.py): every function called (`f(...)`, and `t.f` or `(t).f`, which call a
one-argument `f` when `t` has no column `f`), every operator (named, and the comparisons that
`IN`, `CASE`, `BETWEEN`, sorting and grouping use without naming them), every type named
(its input function, the casts to it and a domain's checks run), every `TABLESAMPLE` method,
and every relation read (a view's query runs, and a table's row security policies).

pgbench's `:variables` are pgbench's, not SQL: before parsing, each is replaced as the
extended and prepared protocols send it, by a parameter (` $n `, spaced so that a variable
pasted into a word by the simple protocol cannot make another name: such a script does not
parse, and is refused).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pglast import ast, parse_plpgsql, parse_sql
from pglast.enums import TransactionStmtKind, VariableSetKind
from pglast.parser import ParseError

from pgscope.drive.scriptlex import Command

# Settings a read may not set: the read-only guard, how the server reads the script's text,
# and who the session's functions run as (what is resolved is resolved as the session's role).
REFUSED_SETTINGS = {
    "default_transaction_read_only": "the read-only setting",
    "transaction_read_only": "the read-only setting",
    "standard_conforming_strings": "how the server reads the script's text",
    "client_encoding": "how the server reads the script's text",
    "role": "the session's role (SET ROLE)",
    "session_authorization": "the session's role (SET SESSION AUTHORIZATION)",
}
# Comparison operators used without being named (IN, CASE, BETWEEN, DISTINCT, ORDER BY,
# GROUP BY, GREATEST/LEAST, row comparisons): always resolved.
IMPLICIT_OPERATORS = frozenset({"=", "<>", "<", ">", "<=", ">="})
_TRANSACTION_KINDS = frozenset(
    {
        TransactionStmtKind.TRANS_STMT_BEGIN,
        TransactionStmtKind.TRANS_STMT_START,
        TransactionStmtKind.TRANS_STMT_COMMIT,
        TransactionStmtKind.TRANS_STMT_ROLLBACK,
        TransactionStmtKind.TRANS_STMT_SAVEPOINT,
        TransactionStmtKind.TRANS_STMT_RELEASE,
        TransactionStmtKind.TRANS_STMT_ROLLBACK_TO,
    }
)
_WRITES = {
    "InsertStmt": "INSERT",
    "UpdateStmt": "UPDATE",
    "DeleteStmt": "DELETE",
    "MergeStmt": "MERGE",
}


@dataclass(frozen=True)
class Name:
    """Something a statement makes the server run, as the script names it."""

    kind: str  # function, operator, type, relation
    schema: str | None  # None: unqualified, resolved in every schema
    name: str
    one_argument: bool = False  # a function called as `t.f`: only f(x) is a candidate

    def shown(self) -> str:
        qualified = f"{self.schema}.{self.name}" if self.schema else self.name
        return f"{qualified}()" if self.kind == "function" else qualified


@dataclass
class Uses:
    """What one statement would run: `where` is `file line N`."""

    where: str
    names: set[Name]


class NotARead(Exception):
    """A statement that is not a read, in words."""


# Variables pgbench sets itself.
_BUILTIN_VARIABLES = frozenset({"scale", "client_id", "random_seed"})


def defined_variables(commands: list[Command]) -> Callable[[str], bool]:
    """Which `:name`s pgbench may replace, given every command of the scripts it runs
    together (variables are the client's, shared by its scripts): its own, those `\\set`,
    and any a `\\gset` or `\\aset` may set (the names its prefix starts)."""
    names = set(_BUILTIN_VARIABLES)
    prefixes = []
    for command in commands:
        words = command.args.split()
        if command.meta in ("set", "setshell") and words:
            names.add(words[0])
        elif command.meta in ("gset", "aset"):
            prefixes.append(words[0] if words else "")
    return lambda name: name in names or any(name.startswith(p) for p in prefixes)


def read_uses(
    command: Command, where: str, defined: Callable[[str], bool] = lambda name: True
) -> Uses:
    """What an SQL command would run, if it is a read; NotARead (in words) if not. `defined`:
    the variables pgbench may replace in it (defined_variables)."""
    try:
        statements = parse_sql(command.parameterised(defined))
    except ParseError as exc:
        raise NotARead(
            f"PostgreSQL's parser does not read it ({str(exc).splitlines()[0]}), so it "
            f"cannot be judged"
        ) from None
    names: set[Name] = set()
    for raw in statements:
        _judge(raw.stmt)
        names |= uses_of(raw.stmt)
    return Uses(where, names)


def sql_uses(sql: str) -> set[Name]:
    """What a view's query or a policy's expression (`SELECT expr`), as the server deparses
    it, would run; NotARead when it is not a read (or does not parse)."""
    try:
        statements = parse_sql(sql)
    except ParseError as exc:
        raise NotARead(f"PostgreSQL's parser does not read it ({exc})") from None
    names: set[Name] = set()
    for raw in statements:
        _judge_query(raw.stmt)
        names |= uses_of(raw.stmt)
    return names


def _judge(statement: ast.Node | None) -> None:
    """Raise NotARead unless `statement` is a read."""
    kind = type(statement).__name__
    if isinstance(statement, (ast.SelectStmt, ast.VariableShowStmt)):
        _judge_query(statement)
    elif isinstance(statement, ast.ExplainStmt):
        _judge(statement.query)
    elif isinstance(statement, ast.VariableSetStmt):
        _judge_set(statement)
    elif isinstance(statement, ast.TransactionStmt):
        if statement.kind not in _TRANSACTION_KINDS:
            raise NotARead("a prepared (two-phase) transaction's command")
        if _read_write(statement.options):
            raise NotARead("a READ WRITE transaction")
    else:
        raise NotARead(f"{_statement_name(kind)}, which is not a read")


def _judge_query(statement: object) -> None:
    """A query reads when nothing in it writes, locks rows or makes a table."""
    for node in _nodes(statement):
        name = type(node).__name__
        if name in _WRITES:
            raise NotARead(f"{_WRITES[name]} in a WITH query, which writes")
        if isinstance(node, ast.SelectStmt):
            if node.intoClause is not None:
                raise NotARead("SELECT INTO, which creates a table")
            if node.lockingClause:
                raise NotARead("a locking clause (FOR UPDATE, FOR SHARE ...), which writes rows")


def _judge_set(statement: ast.VariableSetStmt) -> None:
    kind = statement.kind
    if kind == VariableSetKind.VAR_RESET_ALL:
        raise NotARead("RESET ALL")
    if kind == VariableSetKind.VAR_SET_MULTI:
        if statement.name != "TRANSACTION":
            raise NotARead(f"SET {statement.name}")
        if _read_write(statement.args):
            raise NotARead("a READ WRITE transaction")
        return
    name = (statement.name or "").lower()
    if name in REFUSED_SETTINGS:
        raise NotARead(f"a change of {REFUSED_SETTINGS[name]} ({name})")


def _read_write(options: tuple[ast.Node, ...] | None) -> bool:
    """Whether transaction options ask for READ WRITE."""
    for option in options or ():
        if isinstance(option, ast.DefElem) and option.defname == "transaction_read_only":
            value = getattr(option.arg, "val", None)
            if not isinstance(value, ast.Integer) or value.ival != 1:
                return True
    return False


# Statements whose node's name is not their first words.
_STATEMENT_NAMES = {
    **_WRITES,
    "CreateStmt": "CREATE TABLE",
    "CreateTableAsStmt": "CREATE TABLE AS",
    "CreateFunctionStmt": "CREATE FUNCTION",
    "DoStmt": "a DO block",
    "DropStmt": "DROP",
    "GrantStmt": "GRANT",
    "GrantRoleStmt": "GRANT",
    "ExecuteStmt": "EXECUTE",
    "PrepareStmt": "PREPARE",
    "DeclareCursorStmt": "DECLARE",
    "VacuumStmt": "VACUUM or ANALYZE",
    "IndexStmt": "CREATE INDEX",
    "ViewStmt": "CREATE VIEW",
    "RuleStmt": "CREATE RULE",
    "CreateTrigStmt": "CREATE TRIGGER",
    "LoadStmt": "LOAD",
    "CheckPointStmt": "CHECKPOINT",
    "RefreshMatViewStmt": "REFRESH MATERIALIZED VIEW",
}


def _statement_name(kind: str) -> str:
    """`InsertStmt` -> `INSERT`, `AlterSystemStmt` -> `ALTER SYSTEM`."""
    if kind in _STATEMENT_NAMES:
        return _STATEMENT_NAMES[kind]
    words = []
    current = ""
    for ch in kind.removesuffix("Stmt"):
        if ch.isupper() and current:
            words.append(current)
            current = ""
        current += ch
    words.append(current)
    return " ".join(words).upper() or kind


def _nodes(node: object) -> Iterator[ast.Node]:
    """`node` and every node under it."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Node):
            yield item
            for slot in _slots(type(item)):
                stack.append(getattr(item, slot, None))
        elif isinstance(item, tuple | list):
            stack.extend(item)


_SLOTS: dict[str, tuple[str, ...]] = {}


def _slots(cls: type) -> tuple[str, ...]:
    """A node class's attributes, its bases' too; not Node's own `ancestors`, which lead up."""
    if cls.__name__ not in _SLOTS:
        _SLOTS[cls.__name__] = tuple(
            slot
            for base in cls.__mro__
            if base not in (ast.Node, object)
            for slot in vars(base).get("__slots__", ())
        )
    return _SLOTS[cls.__name__]


def _strings(values: tuple[ast.Node, ...] | None) -> list[str]:
    return [v.sval or "" for v in values or () if isinstance(v, ast.String)]


def _qualified(kind: str, parts: list[str], one_argument: bool = False) -> Name | None:
    if not parts:
        return None
    schema = parts[-2] if len(parts) >= 2 else None
    return Name(kind, schema, parts[-1], one_argument)


def uses_of(statement: object) -> set[Name]:
    """Every function, operator, type and relation `statement` names."""
    found: set[Name | None] = {Name("operator", None, op) for op in IMPLICIT_OPERATORS}
    for node in _nodes(statement):
        if isinstance(node, ast.FuncCall):
            found.add(_qualified("function", _strings(node.funcname)))
        elif isinstance(node, ast.A_Expr):
            parts = _strings(node.name)
            if parts and parts[-1].replace(" ", "").isalpha():  # BETWEEN and its kin: comparisons
                continue
            found.add(_qualified("operator", parts))
        elif isinstance(node, ast.SubLink) and node.operName:
            found.add(_qualified("operator", _strings(node.operName)))
        elif isinstance(node, ast.SortBy) and node.useOp:
            found.add(_qualified("operator", _strings(node.useOp)))
        elif isinstance(node, ast.RangeTableSample):  # its method is a handler function
            found.add(_qualified("function", _strings(node.method)))
        elif isinstance(node, ast.TypeName):
            found.add(_qualified("type", _strings(node.names)))
        elif isinstance(node, ast.RangeVar):
            found.add(Name("relation", node.schemaname, node.relname or ""))
        elif isinstance(node, ast.ColumnRef):
            # `t.f` calls f(t) when t has no column f (attribute notation).
            for field in _strings(node.fields)[1:]:
                found.add(Name("function", None, field, one_argument=True))
        elif isinstance(node, ast.A_Indirection):
            for field in _strings(node.indirection):
                found.add(Name("function", None, field, one_argument=True))
    return {name for name in found if name is not None}


# PL/pgSQL statements that run SQL built at run time: what they run cannot be judged.
_DYNAMIC_PLPGSQL = frozenset({"PLpgSQL_stmt_dynexecute", "PLpgSQL_stmt_dynfors"})
# An assignment's target (`x :=`, `x.y[1] =`), before the expression PL/pgSQL evaluates.
_ASSIGNED = re.compile(r"^[^:=]*?(?::=|=)(?P<value>.*)$", re.S)


def body_uses(language: str, definition: str) -> set[Name]:
    """What a function's body would run, from its definition (`pg_get_functiondef`), for the
    languages whose bodies are read here: SQL (its statements, or its `BEGIN ATOMIC` / `RETURN`
    body) and PL/pgSQL (every SQL statement and expression in it). NotARead when the body is
    not only reads, runs SQL built at run time, or does not parse. A STABLE function that
    calls a volatile one (`SELECT pg_stat_reset()`) is allowed by PostgreSQL: this is what
    finds it."""
    try:
        if language == "plpgsql":
            return _plpgsql_uses(parse_plpgsql(definition))
        [raw] = parse_sql(definition)
    except ParseError as exc:
        raise NotARead(f"PostgreSQL's parser does not read its body ({exc})") from None
    create = raw.stmt
    if not isinstance(create, ast.CreateFunctionStmt):
        raise NotARead("its definition is not a function's")
    if create.sql_body is not None:
        _judge_query(create.sql_body)
        return uses_of(create.sql_body)
    sources = [
        text
        for option in create.options or ()
        if isinstance(option, ast.DefElem) and option.defname == "as"
        for text in _strings(option.arg if isinstance(option.arg, tuple) else (option.arg,))
    ]
    return set().union(*(sql_uses(text) for text in sources))


def _plpgsql_uses(tree: object) -> set[Name]:
    names: set[Name] = set()
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if _DYNAMIC_PLPGSQL & item.keys() or "dynquery" in item:
                raise NotARead("EXECUTE of a built string, which cannot be judged")
            expression = item.get("PLpgSQL_expr")
            if isinstance(expression, dict):
                names |= _plpgsql_expression(expression)
            stack.extend(item.values())
    return names


def _plpgsql_expression(expression: dict[str, Any]) -> set[Name]:
    """What one PL/pgSQL expression or statement runs (by its parse mode: 0 a statement, 2 an
    expression, 3 to 5 an assignment)."""
    query = str(expression.get("query", ""))
    mode = int(expression.get("parseMode", 0))
    if mode >= 3:
        assigned = _ASSIGNED.match(query)
        if assigned is None:
            raise NotARead(f"PL/pgSQL assignment {query!r} is not read here")
        query = assigned["value"]
    try:
        statements = parse_sql(query if mode == 0 else f"SELECT {query}")
    except ParseError as exc:
        raise NotARead(f"PostgreSQL's parser does not read {query!r} ({exc})") from None
    names: set[Name] = set()
    for raw in statements:
        _judge(raw.stmt)
        names |= uses_of(raw.stmt)
    return names
