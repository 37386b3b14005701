# Copies the viewer's page (its files from SOURCE, as CMakeLists.txt's page_files) and OpenSeadragon (OSD: its build folder in node_modules) to DEST.
if(NOT EXISTS ${OSD}/openseadragon.min.js)
  message(FATAL_ERROR "OpenSeadragon is not installed (${OSD}/openseadragon.min.js): run scripts/install-deps.sh, "
                      "which runs `npm ci` in viewer/web")
endif()
file(MAKE_DIRECTORY ${DEST})
foreach(f index.html viewer.js viewer.css)
  file(COPY ${SOURCE}/${f} DESTINATION ${DEST})
endforeach()
file(COPY ${OSD}/openseadragon.min.js DESTINATION ${DEST})
file(REMOVE_RECURSE ${DEST}/images)
file(COPY ${OSD}/images DESTINATION ${DEST})
file(TOUCH ${DEST}/.copied)
