# The two commands of the README:
#   make demo   installs what is needed, builds, and runs the main job (target + initiator,
#               two processes on 127.0.0.1 with P2PHANDSHAKE, 1 GiB moved and verified)
#   make test   builds and runs every test (C++ unit and multi-process suites, Python suites)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build demo test unit pytest pytest-python clean

all: build

deps:
	scripts/install_deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: deps build
	scripts/demo.sh $(BUILD)

unit: build
	cd $(BUILD) && ctest --output-on-failure -j 2

pytest: build
	MC_BUILD_DIR=$(abspath $(BUILD)) python3 -m pytest -q tests --ignore=tests/python

# The Python package: pip install . into build/py-venv, then tests/python.
pytest-python:
	JOBS=$(JOBS) scripts/python_test.sh

test: unit pytest pytest-python

clean:
	rm -rf $(BUILD)
