/* kcheck.h — moved to backend/kcheck.h (the checks belong to the backends
 * that call them). This forward remains only while the CPU kernels
 * (src/backend/cpu, nine files) still include "ops/kcheck.h"; delete it once
 * they include "backend/kcheck.h". */
#include "backend/kcheck.h"
