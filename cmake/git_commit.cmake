# Script mode (cmake -DSRC=... -DOUT=... -P git_commit.cmake), run at every build: writes OUT
# defining LP_GIT_COMMIT (the short commit of SRC, "-dirty" with uncommitted changes) only when
# it changed, so `run --json` and traces name the commit the binary was built from.
include(${CMAKE_CURRENT_LIST_DIR}/write_if_changed.cmake)
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY "${SRC}"
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit unknown)
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY "${SRC}"
                  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(dirty)
    set(commit "${commit}-dirty")
  endif()
endif()
set(text "// Generated at build time by cmake/git_commit.cmake.\n#pragma once\n#define LP_GIT_COMMIT \"${commit}\"\n")
lp_write_if_changed("${OUT}" "${text}")
