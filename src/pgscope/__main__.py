from pgscope.cli import entry

entry()
