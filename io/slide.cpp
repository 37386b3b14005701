#include "io/slide.h"
