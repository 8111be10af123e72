"""``python -m langchain_compaction``: the command line."""

from langchain_compaction.cli import main

raise SystemExit(main())
