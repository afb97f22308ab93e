"""A pgbench script read as pgbench and PostgreSQL read it: commands, and tokens whose
quoting is undone, so that what the script means is judged, not how it is spelled.

pgbench splits a script with psql's lexer (psqlscan.l, standard_conforming_strings on): a
backslash outside quotes and comments starts a meta-command that runs to the end of its line
(`\\` before the line's end continues it), `;` ends an SQL command, `\\;` joins two into one
and `\\:` is a colon. The server's lexer (scan.l) reads the SQL: `--` and nested `/* */`
comments, '...' strings with '' (E'...' with backslash escapes, U&'...' with Unicode escapes
and UESCAPE), dollar quotes $tag$...$tag$, "..." identifiers with "" (U&"..." too), and
unquoted identifiers, which it folds to lower case. Tokens here carry their meaning: a word
lower-cased, a quoted identifier or a string decoded, so `"default\\005ftransaction_read_only"`
spelled as U&"default\\005ftransaction_read_only" is that name, and `READ/**/WRITE` is READ
then WRITE.

A `:name` in SQL is pgbench's own business: before sending a command it pastes a variable's
text over every `:name` in it (simple protocol), quotes and comments included, or sends it as
a parameter (extended and prepared). `variables()` finds them as pgbench does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

# psqlscan.l / scan.l: identifier characters (any byte with the high bit set is one).
_IDENT_START = re.compile(r"[A-Za-z_\x80-\U0010ffff]")
_IDENT = re.compile(r"[A-Za-z_\x80-\U0010ffff][A-Za-z_0-9$\x80-\U0010ffff]*")
_DOLLAR_QUOTE = re.compile(r"\$(?:[A-Za-z_\x80-\U0010ffff][A-Za-z_0-9\x80-\U0010ffff]*)?\$")
_PARAM = re.compile(r"\$\d+")
_NUMBER = re.compile(r"(?:\d[\w]*(?:\.[\w]*)?|\.\d[\w]*)")
# pgbench's parseVariable(): a colon, then a letter, `_` or a high-bit byte, then those or
# digits; `::` is a cast, never a variable.
_VARIABLE = re.compile(r"(?<!:):([A-Za-z_\x80-\U0010ffff][A-Za-z_0-9\x80-\U0010ffff]*)")
# E'...': \ooo, \xhh, \uXXXX, \UXXXXXXXX, or any other character as itself (\n and the like).
_E_ESCAPE = re.compile(
    r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))", re.S
)
# A meta-command's name: pgbench's first word after the backslash, spaces and `\`-newline
# continuations skipped, up to a space or a continuation.
_META_NAME = re.compile(
    r"(?:[ \t\r\f\v]|\\\r?\n)*(?P<name>[^ \t\r\f\v\n\\]*(?:\\(?!\r?\n)[^ \t\r\f\v\n\\]*)*)"
)
_C_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


@dataclass(frozen=True)
class Token:
    kind: str  # word, ident, string, number, param, var, op
    text: str  # its meaning: a word lower-cased, an identifier or string decoded
    line: int


@dataclass
class Command:
    """One SQL statement (`;` and `\\;` end one), or one meta-command (`\\name args`)."""

    line: int
    meta: str | None = None  # the meta-command's name, lower-cased; None for SQL
    args: str = ""  # a meta-command's arguments, as written
    tokens: list[Token] = field(default_factory=list)
    sent: str = ""  # SQL: the text pgbench sends, before it pastes its variables

    def words(self) -> list[str]:
        return [t.text for t in self.tokens if t.kind == "word"]

    def variables(self) -> list[str]:
        """The `:name`s pgbench replaces in this SQL (quoted or commented, it does not care)."""
        return _VARIABLE.findall(self.sent)

    def parameterised(self, defined: Callable[[str], bool] = lambda name: True) -> str:
        """This SQL as the extended protocol sends it: each `:name` that is `defined` (pgbench
        leaves any other as written) is a parameter `$n`; spaced, so that a variable the
        simple protocol would paste into a word does not make another word here (such a text
        does not parse)."""
        numbers: dict[str, int] = {}

        def parameter(found: re.Match[str]) -> str:
            if not defined(found.group(1)):
                return found.group(0)
            return f" ${numbers.setdefault(found.group(1), len(numbers) + 1)} "

        return _VARIABLE.sub(parameter, self.sent)


class _Reader:
    """psqlscan's INITIAL state over one script, with the server's rules inside SQL."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1
        self.commands: list[Command] = []
        self.current: Command | None = None
        # Where the current SQL command's text starts: just after the previous command, so
        # a comment before its first word, which pgbench sends too, is in it.
        self.sent_from = 0

    # -- positions -------------------------------------------------------------------------
    def _advance(self, to: int) -> str:
        chunk = self.text[self.pos : to]
        self.line += chunk.count("\n")
        self.pos = to
        return chunk

    def _end_sql(self, end: int) -> None:
        """The SQL command so far ends at `end` (a `;`, `\\;`, a meta-command, the end)."""
        if self.current is not None:
            self.current.sent = self.text[self.sent_from : end].replace("\\:", ":")
            self.commands.append(self.current)
        self.current = None
        self.sent_from = end

    def _token(self, kind: str, text: str, line: int) -> None:
        if self.current is None:
            self.current = Command(line)
        self.current.tokens.append(Token(kind, text, line))

    # -- the scan --------------------------------------------------------------------------
    def read(self) -> list[Command]:
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            line = self.line
            if ch in " \t\r\n\f\v":
                self._advance(self.pos + 1)
            elif text.startswith("--", self.pos):
                end = text.find("\n", self.pos)
                self._advance(len(text) if end < 0 else end)
            elif text.startswith("/*", self.pos):
                self._advance(self._comment_end(self.pos))
            elif ch == "\\":
                self._backslash()
            elif ch == ";":
                self._end_sql(self.pos)
                self._advance(self.pos + 1)
            elif ch == "'" or (ch in "eEnNbBxX" and text.startswith("'", self.pos + 1)):
                self._string(line)
            elif ch in "uU" and text.startswith("&'", self.pos + 1):
                self._unicode(line, "'")
            elif ch in "uU" and text.startswith('&"', self.pos + 1):
                self._unicode(line, '"')
            elif ch == '"':
                end = self._quoted_end(self.pos + 1, '"')
                body = self._advance(end)[1:-1]
                self._token("ident", body.replace('""', '"'), line)
            elif ch == "$":
                self._dollar(line)
            elif _IDENT_START.match(ch):
                word = _IDENT.match(text, self.pos)
                assert word is not None
                self._token("word", self._advance(word.end()).lower(), line)
            elif ch.isdigit() or (ch == "." and text[self.pos + 1 : self.pos + 2].isdigit()):
                number = _NUMBER.match(text, self.pos)
                assert number is not None
                self._token("number", self._advance(number.end()), line)
            elif (
                ch == ":"
                and (var := _VARIABLE.match(text, self.pos))
                and not (self.pos and text[self.pos - 1] == ":")
            ):
                self._token("var", self._advance(var.end())[1:], line)
            else:
                self._token("op", self._advance(self.pos + 1), line)
        self._end_sql(len(text))
        return _with_uescape(self.commands)

    def _comment_end(self, start: int) -> int:
        """The end of a `/* */` comment starting at `start`: they nest (an unclosed one runs
        to the end of the script, as the server would refuse it)."""
        depth, pos, text = 0, start, self.text
        while pos < len(text):
            if text.startswith("/*", pos):
                depth, pos = depth + 1, pos + 2
            elif text.startswith("*/", pos):
                depth, pos = depth - 1, pos + 2
                if depth == 0:
                    return pos
            else:
                pos += 1
        return len(text)

    def _quoted_end(self, pos: int, quote: str, backslash: bool = False) -> int:
        """Just past the quote that closes a literal whose body starts at `pos` (a doubled
        quote is one quote; with `backslash`, a backslash escapes the next character)."""
        text = self.text
        while pos < len(text):
            ch = text[pos]
            if backslash and ch == "\\":
                pos += 2
            elif ch == quote:
                if text.startswith(quote, pos + 1):
                    pos += 2
                else:
                    return pos + 1
            else:
                pos += 1
        return len(text)

    def _string(self, line: int) -> None:
        prefix = "" if self.text[self.pos] == "'" else self.text[self.pos].lower()
        start = self.pos + len(prefix) + 1
        end = self._quoted_end(start, "'", backslash=prefix == "e")
        body = self._advance(end)[len(prefix) + 1 : -1]
        if prefix == "e":
            body = _E_ESCAPE.sub(_e_escape, body.replace("''", "'"))
        else:
            body = body.replace("''", "'")
        self._token("string", body, line)

    def _unicode(self, line: int, quote: str) -> None:
        end = self._quoted_end(self.pos + 3, quote)
        body = self._advance(end)[3:-1].replace(quote * 2, quote)
        # Decoded once its UESCAPE (if any) is known: _with_uescape.
        self._token("ustring" if quote == "'" else "uident", body, line)

    def _dollar(self, line: int) -> None:
        text = self.text
        delimiter = _DOLLAR_QUOTE.match(text, self.pos)
        if delimiter is not None:
            tag = delimiter.group(0)
            close = text.find(tag, delimiter.end())
            end = len(text) if close < 0 else close + len(tag)
            body = self._advance(end)[len(tag) : -len(tag) if close >= 0 else None]
            self._token("string", body, line)
        elif (param := _PARAM.match(text, self.pos)) is not None:
            self._token("param", self._advance(param.end()), line)
        else:
            self._token("op", self._advance(self.pos + 1), line)

    def _backslash(self) -> None:
        """`\\;` and `\\:` belong to the SQL; any other backslash starts a meta-command,
        which ends the SQL command before it and runs to its line's end."""
        text, line = self.text, self.line
        following = text[self.pos + 1 : self.pos + 2]
        if following == ";":
            # One command for pgbench, two statements for the server: judged as two.
            self._end_sql(self.pos)
            self._advance(self.pos + 2)
            return
        if following == ":":
            self._token("op", ":", line)
            self._advance(self.pos + 2)
            return
        self._end_sql(self.pos)
        end = self.pos + 1
        while end < len(text) and text[end] != "\n":
            if text[end] == "\\" and text[end + 1 : end + 2] == "\n":
                end += 2  # `\` at a line's end continues the meta-command
            elif text.startswith("\\\r\n", end):
                end += 3
            else:
                end += 1
        body = self._advance(end)[1:]
        self.sent_from = self.pos
        # pgbench's word: the characters up to a space, after spaces and continuations.
        found = _META_NAME.match(body)
        assert found is not None
        self.commands.append(
            Command(line, meta=found["name"].lower(), args=body[found.end() :].strip())
        )


def _e_escape(found: re.Match[str]) -> str:
    octal, hexa, u4, u8, other = found.groups()
    code = int(octal, 8) if octal else int(hexa or u4 or u8, 16) if (hexa or u4 or u8) else None
    if code is None:
        return _C_ESCAPES.get(other, other)
    return chr(code) if code <= 0x10FFFF else ""


def decode_unicode(body: str, escape: str = "\\") -> str:
    """A U&'...' or U&"..." body with its escapes (`\\XXXX`, `\\+XXXXXX`, a doubled escape
    character) decoded, as the server decodes it; an escape it would reject stays as
    written."""
    out: list[str] = []
    pos = 0
    while pos < len(body):
        ch = body[pos]
        if ch != escape:
            out.append(ch)
            pos += 1
            continue
        if body.startswith(escape, pos + 1):
            out.append(escape)
            pos += 2
            continue
        six = re.match(r"\+([0-9A-Fa-f]{6})", body[pos + 1 :])
        four = re.match(r"([0-9A-Fa-f]{4})", body[pos + 1 :])
        found = six or four
        if found is None:
            out.append(ch)
            pos += 1
            continue
        code = int(found.group(1), 16)
        out.append(chr(code) if code <= 0x10FFFF else found.group(0))
        pos += 1 + len(found.group(0))
    text = "".join(out)
    # A UTF-16 surrogate pair written as two escapes is one character to the server.
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _with_uescape(commands: list[Command]) -> list[Command]:
    """U& literals decoded, with the escape character a following `UESCAPE 'c'` names."""
    for command in commands:
        tokens, out = command.tokens, []
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token.kind in ("ustring", "uident"):
                escape = "\\"
                if (
                    i + 2 < len(tokens)
                    and tokens[i + 1].kind == "word"
                    and tokens[i + 1].text == "uescape"
                    and tokens[i + 2].kind == "string"
                    and len(tokens[i + 2].text) == 1
                ):
                    escape = tokens[i + 2].text
                    i += 2
                kind = "string" if token.kind == "ustring" else "ident"
                out.append(Token(kind, decode_unicode(token.text, escape), token.line))
            else:
                out.append(token)
            i += 1
        command.tokens = out
    return commands


def read_script(text: str) -> list[Command]:
    """The script's commands in order: SQL statements and meta-commands."""
    return _Reader(text).read()
