"""Summarizers: chat models, plain callables, the offline extractive one."""
