// The version of epx. CMake reads EPX_VERSION_STRING from this file.
#pragma once

#define EPX_VERSION_MAJOR 0
#define EPX_VERSION_MINOR 1
#define EPX_VERSION_PATCH 0
#define EPX_VERSION_STRING "0.1.0"
