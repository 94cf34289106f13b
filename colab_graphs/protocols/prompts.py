"""Prompt templates shared by the built-in protocols. Override any of them with `-P prompt=...`."""

ANSWER = "{input}\n\nAnswer concisely. End with: The answer is <answer>."
