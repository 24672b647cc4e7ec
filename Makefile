# The two commands of the README:
#   make demo   installs what is needed, builds, and runs the main job (target + initiator,
#               two processes on 127.0.0.1 with P2PHANDSHAKE, 1 GiB moved and verified)
#   make test   builds and runs every test (C++ unit and multi-process suites, Python suites,
#               tests/multihost: hosts as network namespaces on a bridge)
#   make store-demo  installs the Python package into build/py-venv and runs the Store example:
#               mooncake_master + a writer client + a reader client (three processes)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build demo store-demo test unit pytest pytest-python clean

all: build

deps:
	scripts/install_deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: deps build
	scripts/demo.sh $(BUILD)

store-demo: deps
	MC_PY_INSTALL_ONLY=1 JOBS=$(JOBS) scripts/python_test.sh
	PYTHON=build/py-venv/bin/python examples/python/run_store.sh

unit: build
	cd $(BUILD) && ctest --output-on-failure -j 2

pytest: build
	MC_BUILD_DIR=$(abspath $(BUILD)) python3 -m pytest -q tests --ignore=tests/python

# The Python package: pip install . into build/py-venv, then tests/python.
pytest-python:
	JOBS=$(JOBS) scripts/python_test.sh

# pytest-python before pytest: tests/multihost runs Store clients with build/py-venv's package.
test: unit pytest-python pytest

clean:
	rm -rf $(BUILD)
