"""The framework-neutral core: imports nothing from LangChain, LangGraph or Anthropic."""
