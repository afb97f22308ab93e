"""`python -m pgscope.tables`: the declared tables as docs/store.md lists them."""

from pgscope.tables import markdown

print(markdown(), end="")
