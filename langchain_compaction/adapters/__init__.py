"""Adapters from LangChain and LangGraph objects to the core."""
