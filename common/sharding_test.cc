#include "common/sharding.h"
#include "gtest/gtest.h"
