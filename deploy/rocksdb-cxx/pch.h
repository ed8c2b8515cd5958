// The headers that most of RocksDB's 343 source files parse, precompiled once
// per build by `clang++.sh` (beside this file, which says why). Only
// self-contained headers belong here: the C++ standard library's and
// RocksDB's public API (`rocksdb/*.h`, written to be included in any order
// by its users). Each is guarded, so a source file's own `#include` of it
// later is a no-op, and no RocksDB source defines a macro that these
// headers read. Not <iostream>: it would give every file a static
// initialiser that only some have.
#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "rocksdb/cache.h"
#include "rocksdb/comparator.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/statistics.h"
#include "rocksdb/status.h"
#include "rocksdb/table.h"
