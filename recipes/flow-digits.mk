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
# (a --json result renamed into place), so make reruns only what is stale, and a changed variable
# reruns the steps whose command it changes (SCALE: the guided and interval samples and their FDs).
# A run or a set of samples is replaced with --force, never resumed.

HERE := $(dir $(lastword $(MAKEFILE_LIST)))
OUT ?= flow-digits
PYTHON ?= python3
SIZE ?= 16x16
SPLIT_SEED ?= 0
FLOW_RECIPE ?= $(HERE)../jepa_cli/recipes/flow-digits-tiny.toml
ENCODER_RECIPE ?= $(HERE)../jepa_cli/recipes/ijepa-digits-tiny.toml
# The measuring encoder trains 3x the recipe's updates with the anti-collapse terms: the recipe's own
# 500 updates end collapsed (effective rank 1.4), and in that space FD ranked guided samples of an
# undertrained flow model above the trained one's (docs/generation.md, "Do the metrics rank ...")
ENCODER_FLAGS ?= --steps 1500 --var-weight 1 --cov-weight 0.1
STEPS ?=
SAMPLES ?= 100
SCALE ?= 2
INTERVAL ?= 0.22,0.84
SAMPLE_SEED ?= 0

SETS := unguided guided interval
GUIDANCE_unguided := --guidance-scale 1
GUIDANCE_guided = --guidance-scale $(SCALE)
GUIDANCE_interval = --guidance-scale $(SCALE) --guidance-interval $(INTERVAL)

# The arguments of each command whose variables can change; recipes/common.mk reruns a target when
# they differ from the last run's (OUT/.vars-<name>). The recipes are made absolute so that the same
# file named from another directory is the same text.
VARS := data-train data-test flow encoder $(foreach s,$(SETS),samples-$(s))
VARS_data-train = ingest builtin:digits $(call q,$(OUT)/data-train.zarr) --size $(SIZE) --split train --seed $(SPLIT_SEED) --force -q
VARS_data-test = ingest builtin:digits $(call q,$(OUT)/data-test.zarr) --size $(SIZE) --split test --seed $(SPLIT_SEED) --force -q
VARS_flow = train --config $(call q,$(abspath $(FLOW_RECIPE))) --data $(call q,$(OUT)/data-train.zarr) --out $(call q,$(OUT)/flow) \
            $(if $(STEPS),--steps $(STEPS)) --force --json -q
VARS_encoder = train --config $(call q,$(abspath $(ENCODER_RECIPE))) --data $(call q,$(OUT)/data-train.zarr) \
               --out $(call q,$(OUT)/encoder) $(ENCODER_FLAGS) --force --json -q
SAMPLE = sample $(call q,$(OUT)/flow) -n $(SAMPLES) --classes all $(GUIDANCE_$(1)) --seed $(SAMPLE_SEED) \
         -o $(call q,$(OUT)/samples-$(1).zarr) --force --json -q
$(foreach s,$(SETS),$(eval VARS_samples-$(s) = $$(call SAMPLE,$(s))))
PREREQ_FILES := FLOW_RECIPE ENCODER_RECIPE

.DEFAULT_GOAL := all
include $(HERE)common.mk

.PHONY: all
.DELETE_ON_ERROR:
.SECONDARY:
all: $(OUT)/table.txt
	@cat $(call q,$<)

$(OUT)/data-%.zarr/zarr.json: $(OUT)/.vars-data-%
	$(JEPA) $(VARS_data-$*)

$(OUT)/flow.json: $(OUT)/data-train.zarr/zarr.json $(FLOW_RECIPE) $(OUT)/.vars-flow
	$(JEPA) $(VARS_flow) > $(call q,$@.tmp)
	@mv $(call q,$@.tmp) $(call q,$@)

$(OUT)/encoder.json: $(OUT)/data-train.zarr/zarr.json $(ENCODER_RECIPE) $(OUT)/.vars-encoder
	$(JEPA) $(VARS_encoder) > $(call q,$@.tmp)
	@mv $(call q,$@.tmp) $(call q,$@)

$(OUT)/samples-%.json: $(OUT)/flow.json $(OUT)/.vars-samples-%
	$(JEPA) $(VARS_samples-$*) > $(call q,$@.tmp)
	@mv $(call q,$@.tmp) $(call q,$@)

$(OUT)/fd-%.json: $(OUT)/samples-%.json $(OUT)/encoder.json $(OUT)/data-test.zarr/zarr.json
	$(JEPA) fd $(call q,$(OUT)/data-test.zarr) $(call q,$(OUT)/samples-$*.zarr) --run $(call q,$(OUT)/encoder) --json > $(call q,$@.tmp)
	@mv $(call q,$@.tmp) $(call q,$@)

$(OUT)/table.txt: $(foreach s,$(SETS),$(OUT)/fd-$(s).json)
	$(PYTHON) $(call q,$(HERE)../scripts/fd_table.py) --title "To the real test split in the I-JEPA encoder's space" $(foreach f,$^,$(call q,$(f))) > $(call q,$@.tmp)
	@mv $(call q,$@.tmp) $(call q,$@)
