"""LangChain glue shared by every adapter: conversion, counting, the compaction pipeline (private)."""
