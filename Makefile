# crun — the two commands of the quick start, and a few helpers.
#   make demo   set up, build, run the main job on 4 ranks
#   make test   set up, build, run every test (C tests + busted specs, via ctest)
#   make fault-inject  kill random ranks/the launcher during collectives, check what is left (FI_RUNS=100)
#   make conformance   random programs on crun (tcp, shm, mpi) and on torch+Gloo, outputs compared (CONF_PROGRAMS=24)
#   make fuzz   build the libFuzzer targets (clang, build-fuzz) and run each FUZZ_SECONDS (60)
#   make test-asan / test-tsan  the suite under ASan+UBSan / TSan (build-asan, build-tsan)
#   make soak   SOAK_OPS random collectives on SOAK_RANKS ranks, tcp and shm (SAN=address|thread)
#   make bench  every side-by-side comparison (collectives, store, launch, training) -> bench/results/
#   make package        build-deb/crun_<version>_amd64.deb (CPack; prefix /usr)
#   make check-install  the .deb through apt and the rockspec through luarocks (touches the system)
#   make docs   API reference (LDoc over lua/crun, Doxygen over runtime/include) -> build/docs
BUILD ?= build
JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all setup configure build test demo bench clean install fault-inject conformance fuzz \
        package check-install docs

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

# every side-by-side comparison of issue 18 (needs torch, Open MPI, hyperfine,
# an idle machine); writes bench/results/<date>-<cpu>.md. BENCH_SECTIONS picks.
BENCH_SECTIONS ?= coll store launch train
bench: build
	SECTIONS="$(BENCH_SECTIONS)" bash scripts/bench.sh $(BUILD)

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)

# ---------------------------------------------------------------- installing (issue 17)
# package: a .deb from its own tree (build-deb, CMAKE_INSTALL_PREFIX=/usr, no
# tests): apt install ./build-deb/crun_<version>_amd64.deb
DEB_BUILD ?= build-deb
package: setup
	cmake -S . -B $(DEB_BUILD) -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCRUN_BUILD_TESTS=OFF $(CMAKE_FLAGS)
	cmake --build $(DEB_BUILD) -j $(JOBS)
	cd $(DEB_BUILD) && cpack -G DEB
	@ls -l $(DEB_BUILD)/*.deb

# check-install: installs the .deb with apt, runs crun-lua and a pkg-config
# C program against it, removes it and checks nothing is left; then
# `luarocks make` into a temporary tree (scripts/check_install.sh)
check-install: package
	bash scripts/check_install.sh $(DEB_BUILD)

# docs: LDoc over lua/crun and Doxygen over runtime/include -> $(BUILD)/docs
docs: build
	cmake --build $(BUILD) --target docs

# ---------------------------------------------------------------- sanitizers and soak (issue 16)
# test-asan / test-tsan: the whole suite in its own build dir with
# CRUN_SANITIZE=address (ASan+UBSan) or thread (TSan); any report fails its
# test (scripts/san_run.sh). SAN_TESTS='-R regex' runs a subset.
SAN_TESTS ?=
SAN_JOBS  ?= $(JOBS)
.PHONY: test-asan test-tsan soak

build-asan/CMakeCache.txt:
	cmake -S . -B build-asan -DCRUN_SANITIZE=address $(CMAKE_FLAGS)
build-tsan/CMakeCache.txt:
	cmake -S . -B build-tsan -DCRUN_SANITIZE=thread $(CMAKE_FLAGS)

test-asan: setup build-asan/CMakeCache.txt
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure --timeout 1800 -j $(SAN_JOBS) $(SAN_TESTS)

test-tsan: setup build-tsan/CMakeCache.txt
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && ctest --output-on-failure --timeout 1800 -j $(SAN_JOBS) $(SAN_TESTS)

# soak: SOAK_OPS random collectives (jobs/soak.lua) on each of SOAK_RANKS
# (space-separated world sizes) and each backend of SOAK_BACKENDS; with
# SAN=address|thread it runs the crun-lua of build-asan/build-tsan under
# scripts/san_run.sh (a report fails it). SOAK_SEED fixes the sequence.
SOAK_OPS      ?= 10000
SOAK_RANKS    ?= 4 8
SOAK_BACKENDS ?= tcp shm
SOAK_SEED     ?= 16
SOAK_ARGS     ?=
SAN           ?=
soak: $(if $(SAN),$(if $(filter address,$(SAN)),build-asan,build-tsan)/CMakeCache.txt,build)
	@set -e; bdir=$(if $(SAN),$(if $(filter address,$(SAN)),build-asan,build-tsan),$(BUILD)); \
	$(if $(SAN),cmake --build $$bdir -j $(JOBS);) \
	wrap=""; \
	if [ -n "$(SAN)" ]; then \
	  wrap="bash scripts/san_run.sh $(SAN) $$bdir/san-reports $$bdir/san-bin --"; \
	fi; \
	for n in $(SOAK_RANKS); do for b in $(SOAK_BACKENDS); do \
	  echo "soak: $(SOAK_OPS) ops, $$n ranks, $$b$(if $(SAN), ($(SAN) sanitizer))"; \
	  CRUN_TRANSPORT=$$b $$wrap $$bdir/crun-lua -n $$n --master-port 0 jobs/soak.lua --ops $(SOAK_OPS) \
	    --seed $(SOAK_SEED) $(SOAK_ARGS); \
	done; done
