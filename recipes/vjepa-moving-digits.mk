# V-JEPA on builtin:moving-digits end to end, no downloads: 16-frame 32x32 clips, a stratified
# train/test split, jepa_cli/recipes/vjepa-moving-digits-tiny.toml, and the linear and k-NN probes of
# the raw clips, the random initialisation and the pretrained encoder (mean-pooled; OUT/table.txt;
# docs/video.md). The steps and their files are recipes/quickstart.mk's.
#
#   make -f recipes/vjepa-moving-digits.mk [OUT=moving-digits] [STEPS=...]
#   make -f recipes/vjepa-moving-digits.mk SOURCE=videos/ SHAPE_FLAGS="--frames 16 --frame-stride 4 --size 64x64"

HERE := $(dir $(lastword $(MAKEFILE_LIST)))
OUT ?= moving-digits
SOURCE ?= builtin:moving-digits
SHAPE_FLAGS ?=
RECIPE ?= $(HERE)../jepa_cli/recipes/vjepa-moving-digits-tiny.toml

include $(HERE)quickstart.mk
