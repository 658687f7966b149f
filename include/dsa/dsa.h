// DSA: DeepSeek Sparse Attention inference runtime. Umbrella header.
#pragma once
#include "dsa/attention.h"
#include "dsa/cache.h"
#include "dsa/dist.h"
#include "dsa/geometry.h"
#include "dsa/indexer.h"
#include "dsa/layer.h"
#include "dsa/numerics.h"
#include "dsa/planner.h"
#include "dsa/runtime.h"
#include "dsa/status.h"
#include "dsa/topk.h"
#include "dsa/types.h"
