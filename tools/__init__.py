"""tools: repository tooling run by the Makefile (check_node.py: is this Node.js one the pinned CDK CLI runs on).
Imports nothing of the project."""
