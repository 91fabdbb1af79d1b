#!/bin/sh
# Runs "$@" with A2D_MPI_WAIT=sleep on world rank 1 only (the others spin): a2d must refuse.
if [ "${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then
  export A2D_MPI_WAIT=sleep
fi
exec "$@"
