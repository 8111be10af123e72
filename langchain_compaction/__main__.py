"""``python -m langchain_compaction``: the command line."""

from langchain_compaction.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
