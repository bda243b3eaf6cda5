# Two entry points a user needs: `make demo` and `make test`.
# Both create .venv/ (with the project installed editable) when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-kafka test lint bench-quick clean clean-numba aot

# the kernels of an in-process join compiled ahead of time (numba.pycc
# and gcc): a `panjoin` process then runs them without loading Numba (panjoin/jit/ahead.py);
# rebuilt when a kernel's source changes (a stale build is not used)
AOT := panjoin/jit/_ahead.json
AOT_SRC := $(shell find panjoin/subwindow/kernels -name '*.py') \
	panjoin/jit/ahead.py panjoin/jit/build.py panjoin/manager/kernels.py panjoin/key_sort_kernels.py \
	panjoin/sharding_kernels.py

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,bench,opencl,spark,peers]'
	sh scripts/system_deps.sh
	touch $(STAMP)

$(AOT): $(STAMP) $(AOT_SRC)
	$(BIN)/python -m panjoin.jit.build || echo "note: no kernels compiled ahead of time (they \
	need a C compiler and Python's headers: apt install gcc python3-dev); Numba's JIT runs \
	every kernel, and the tests of the build fail saying so"

aot: $(AOT)

# the whole Kafka path: embedded broker, local cluster, a generated stream produced into
# two topics, the Spark job (spark_conn/); the cluster-only demo is `panjoin demo`
demo: $(STAMP) $(AOT)
	$(BIN)/python -m spark_conn.demo

demo-kafka: demo

test: $(STAMP) $(AOT)
	$(BIN)/ruff check panjoin workers tests benchmarks scripts opencl spark_conn
	# one process fills Numba's disk cache first: every worker a test starts compiles
	# its kernels before it serves, and on a cold cache they would all compile at once
	$(BIN)/python -m workers.warm_up
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.index_sweep --quick

clean: clean-numba
	rm -rf $(VENV) build *.egg-info .pytest_cache panjoin/jit/_ahead*

# Numba's disk cache keys a kernel on its own file only: after pulling a change to a
# kernel that others inline (scan, window, primitives), drop the stale compiled ones
clean-numba:
	find panjoin opencl workers spark_conn -name '*.nb[ic]' -delete
