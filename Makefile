# crun — the two commands of the quick start, and a few helpers.
#   make demo   set up, build, run the main job on 4 ranks
#   make test   set up, build, run every test (C tests + busted specs, via ctest)
#   make fault-inject  kill random ranks/the launcher during collectives, check what is left (FI_RUNS=100)
#   make conformance   random programs on crun (tcp, shm, mpi) and on torch+Gloo, outputs compared (CONF_PROGRAMS=24)
#   make fuzz   build the libFuzzer targets (clang, build-fuzz) and run each FUZZ_SECONDS (60)
BUILD ?= build
JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all setup configure build test demo bench clean install fault-inject conformance fuzz

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: setup $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -j $(JOBS)

demo: build
	bash scripts/demo.sh $(BUILD)

# kills a random rank or the launcher during random collectives FI_RUNS times
# and checks errors, summary and leftovers (jobs/fault_inject.lua)
FI_RUNS ?= 100
fault-inject: build
	lua5.4 jobs/fault_inject.lua --runs $(FI_RUNS) --crun $(BUILD)/crun-lua

# needs Debian's python3-torch (installed by the script when missing); not part of make test
conformance: build
	bash scripts/conformance.sh $(BUILD)
# builds tests/fuzz with clang in build-fuzz and runs each target FUZZ_SECONDS,
# printing executions, coverage and crashes per target (scripts/fuzz.sh)
FUZZ_SECONDS ?= 60
fuzz:
	bash scripts/fuzz.sh --build $(CURDIR)/build-fuzz --seconds $(FUZZ_SECONDS) --jobs $(JOBS)

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)
