// Precompiled header shared by every target that uses LibTorch (see cmake/Helpers.cmake).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
