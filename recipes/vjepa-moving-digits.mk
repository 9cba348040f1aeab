# V-JEPA on builtin:moving-digits end to end, no downloads: 16-frame 32x32 clips, a stratified
# train/test split, jepa_cli/recipes/vjepa-moving-digits-tiny.toml, and the linear and k-NN probes of
# the raw clips, the random initialisation and the pretrained encoder (mean-pooled; OUT/table.txt;
# docs/video.md). The steps and their files are recipes/quickstart.mk's.
#
#   make -f recipes/vjepa-moving-digits.mk [OUT=moving-digits] [STEPS=...] [SIZE=32x32]
#   make -f recipes/vjepa-moving-digits.mk SOURCE=videos/ FRAMES=16 SIZE=64x64 INGEST_FLAGS="--frame-stride 4"
#
# SIZE is the frame size of the dataset (ingest --size) and of the model (train --image-size); FRAMES
# the frames a clip (ingest --frames; empty: the source's, 16 for builtin:moving-digits and for video
# files), which the model takes from the dataset (the RECIPE leaves num_frames out). The raw linear
# probe reads every pixel of a clip: 16,384 features at 32x32 grey, 196,608 at 64x64 RGB, where its
# fits take minutes (jepa probe warns): RAW_PROBE_FLAGS="--raw-pool 4" averages 4x4 pixel blocks
# first (12,288 features at 64x64 RGB), and RAW_PROBES= (empty) leaves the raw probes out.

HERE := $(dir $(lastword $(MAKEFILE_LIST)))
OUT ?= moving-digits
SOURCE ?= builtin:moving-digits
SIZE ?= 32x32
FRAMES ?=
SHAPE_FLAGS ?= $(if $(FRAMES),--frames $(FRAMES) )--size $(SIZE)
RECIPE ?= $(HERE)../jepa_cli/recipes/vjepa-moving-digits-tiny.toml

include $(HERE)quickstart.mk
