# The README's two commands live here: `make synth` and `make test`.
# Both create .venv from the pinned requirements and `npm ci` the pinned aws-cdk CLI first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# checkov pins a boto3 that conflicts with requirements.txt: it gets a virtual environment of its own.
CHECKOV_VENV := .venv-checkov
STACK := TrainingClusterStack
# The training lock's wheels, which the node bundle carries (cluster_constructs/bundle.py).
NODE_LOCK := training/node-requirements.txt
WHEELHOUSE := build/wheelhouse
LOCAL_WHEELS := wheels

# Node.js: tools/check_node.py says once per make, in one line, whether yours is one AWS CDK supports (22.x,
# 24.x), warns on one it no longer supports (Node 20 since 2026-10-30) and stops on one the pinned CLI cannot
# run on (< 18). jsii would print a 10-line banner on every synth for Node 20; silence exactly that banner
# (the END_OF_LIFE variable takes a list of major versions), not others.
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
# Synthesis must never reach AWS: no instance-metadata probing for credentials, no CLI telemetry.
export AWS_EC2_METADATA_DISABLED := true
export CDK_DISABLE_CLI_TELEMETRY := true

.PHONY: setup check-node synth deploy diff destroy bootstrap test lint checkov clean

setup: check-node $(VENV)/.installed node_modules/.installed $(WHEELHOUSE)/.fetched

check-node:
	@$(PYTHON) tools/check_node.py

$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python >= 3.11 is required (found %s)" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# For the nodes' platform, not this machine's: x86_64 Linux (every P instance type of the catalog) and the DLAMI
# PyTorch environment's CPython 3.12 (abi3 wheels fit it too). pip checks every file against the lock's hashes.
# manylinux2014 (glibc 2.17, safetensors' wheel): this pip does not count it under manylinux_2_28.
# Wheels you built yourself (Transformer Engine's PyTorch extension: README, "FP8 on the nodes") go in wheels/.
$(WHEELHOUSE)/.fetched: $(NODE_LOCK) $(VENV)/.installed $(wildcard $(LOCAL_WHEELS)/*.whl)
	rm -rf $(WHEELHOUSE)
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
		--only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform linux_x86_64 \
		--implementation cp \
		--python-version 3.12 $(if $(wildcard $(LOCAL_WHEELS)/*.whl),--find-links $(LOCAL_WHEELS)) \
		--dest $(WHEELHOUSE) -r $(NODE_LOCK)
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: setup
	npx --no-install cdk synth $(STACK) --quiet --no-notices --no-version-reporting
	@echo "Template: $(CURDIR)/cdk.out/$(STACK).template.json"

# The documented way to deploy (README, "Deploy"): the CDK CLI with synth's quiet environment (npx cdk run by hand
# prints jsii's Node banner as 11 lines of byte strings). Settings travel in CDK_ARGS, e.g.
#   make deploy CDK_ARGS="-c nodeCount=2 -c spareNodes=1"      make bootstrap CDK_ARGS=aws://ACCOUNT_ID/REGION
# These need credentials, which on an EC2 instance may come from its role: instance metadata is allowed here.
CDK_ARGS ?=
deploy diff destroy bootstrap: export AWS_EC2_METADATA_DISABLED := false
deploy diff destroy: setup
	npx --no-install cdk $@ $(STACK) --no-notices --no-version-reporting $(CDK_ARGS)
bootstrap: setup
	npx --no-install cdk bootstrap --no-notices --no-version-reporting $(CDK_ARGS)

# The suite runs on every core (pytest-xdist); --dist loadfile keeps each file's tests on one worker so a
# module's shared fixtures (a synthesized stack, a fake cluster) are built once, and --no-loadscope-reorder hands
# out the files in conftest.py's order (the slow ones first) instead of by their number of tests, which put the
# two-test drills last. `pytest` alone runs serially.
test: setup lint
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff check --config node_bootstrap/ruff.toml node_bootstrap

# Not part of `make test` (it installs ~100 packages): run by hand, results in docs/security.md. Accepted findings
# are skipped per resource through template metadata (stacks/checkov_exceptions.py); any other finding fails.
checkov: synth $(CHECKOV_VENV)/.installed
	$(CHECKOV_VENV)/bin/checkov --file cdk.out/$(STACK).template.json --framework cloudformation \
		--compact --quiet --skip-download

$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-checkov.txt
	touch $@

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) node_modules cdk.out .pytest_cache .ruff_cache $(WHEELHOUSE)
