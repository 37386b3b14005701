#include "engine/peak.h"
