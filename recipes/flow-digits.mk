# Class-conditional flow matching on builtin:digits, sampled with and without a guidance interval, no
# downloads: ingest a stratified train/test split at 16x16, train the flow DiT
# (jepa_cli/recipes/flow-digits-tiny.toml) and an I-JEPA encoder (the space the Frechet distances are
# measured in, as FD-DINOv2), draw SAMPLES per class unguided, guided over the whole trajectory and
# guided only in INTERVAL, and tabulate each set's FD to the real test split (OUT/table.txt;
# docs/generation.md has the figures measured with 100 per class).
#
#   make -f recipes/flow-digits.mk [OUT=flow-digits] [SCALE=2] [INTERVAL=0.22,0.84] [SAMPLES=100]
#
# As in recipes/quickstart.mk, every target is a file that appears only when its command succeeded
# (a --json result renamed into place), so make reruns only what is stale.

HERE := $(dir $(lastword $(MAKEFILE_LIST)))
OUT ?= flow-digits
JEPA ?= jepa
PYTHON ?= python3
SIZE ?= 16x16
SPLIT_SEED ?= 0
FLOW_RECIPE ?= $(HERE)../jepa_cli/recipes/flow-digits-tiny.toml
ENCODER_RECIPE ?= $(HERE)../jepa_cli/recipes/ijepa-digits-tiny.toml
STEPS ?=
SAMPLES ?= 100
SCALE ?= 2
INTERVAL ?= 0.22,0.84
SAMPLE_SEED ?= 0

SETS := unguided guided interval
GUIDANCE_unguided := --guidance-scale 1
GUIDANCE_guided := --guidance-scale $(SCALE)
GUIDANCE_interval := --guidance-scale $(SCALE) --guidance-interval $(INTERVAL)

.PHONY: all
.DELETE_ON_ERROR:
.SECONDARY:
all: $(OUT)/table.txt
	@cat $<

$(OUT)/data-%.zarr/zarr.json:
	@mkdir -p $(OUT)
	$(JEPA) ingest builtin:digits $(OUT)/data-$*.zarr --size $(SIZE) --split $* --seed $(SPLIT_SEED) --force -q

$(OUT)/flow.json: $(OUT)/data-train.zarr/zarr.json $(FLOW_RECIPE)
	$(JEPA) train --config $(FLOW_RECIPE) --data $(OUT)/data-train.zarr --out $(OUT)/flow $(if $(STEPS),--steps $(STEPS)) --force --json -q > $@.tmp
	@mv $@.tmp $@

$(OUT)/encoder.json: $(OUT)/data-train.zarr/zarr.json $(ENCODER_RECIPE)
	$(JEPA) train --config $(ENCODER_RECIPE) --data $(OUT)/data-train.zarr --out $(OUT)/encoder --force --json -q > $@.tmp
	@mv $@.tmp $@

$(OUT)/samples-%.json: $(OUT)/flow.json
	$(JEPA) sample $(OUT)/flow -n $(SAMPLES) --classes all $(GUIDANCE_$*) --seed $(SAMPLE_SEED) -o $(OUT)/samples-$*.zarr --force --json -q > $@.tmp
	@mv $@.tmp $@

$(OUT)/fd-%.json: $(OUT)/samples-%.json $(OUT)/encoder.json $(OUT)/data-test.zarr/zarr.json
	$(JEPA) fd $(OUT)/data-test.zarr $(OUT)/samples-$*.zarr --run $(OUT)/encoder --json > $@.tmp
	@mv $@.tmp $@

$(OUT)/table.txt: $(foreach s,$(SETS),$(OUT)/fd-$(s).json)
	$(PYTHON) $(HERE)../scripts/fd_table.py --title "FD to the real test split in the I-JEPA encoder space (lower is closer)" $^ > $@.tmp
	@mv $@.tmp $@
