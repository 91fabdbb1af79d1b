# shellcheck shell=bash
# Sourced on the GPU machine (by scripts/gpu/gpu_common.sh; from the repository root): where no
# mpicxx/mpirun is on the PATH and scripts/gpu_fetch_mpi.sh's packages travelled in
# .gpu-deps/debs (carry [".gpu-deps/debs"]), unpacks them with dpkg-deb -x into .gpu-deps/root
# (never into /) and points PATH, LD_LIBRARY_PATH and Open MPI (OPAL_PREFIX and the paths Debian
# configured outside /usr) at that tree. Prints what it found; sets gpu_mpi_source to "system",
# "carried (.gpu-deps/root)" or "none". Changes nothing where a system MPI is there.
gpu_deps=${A2D_GPU_DEPS:-$PWD/.gpu-deps}
gpu_mpi_source=none
if command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
  gpu_mpi_source=system
elif compgen -G "$gpu_deps/debs/libopenmpi3_*.deb" >/dev/null; then
  mpi_root=$gpu_deps/root
  if [[ ! -e $mpi_root/.unpacked ]]; then
    rm -rf "$mpi_root"
    mkdir -p "$mpi_root/bin"
    for deb in "$gpu_deps"/debs/*.deb; do
      if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$deb" "$mpi_root"
      else  # no dpkg: a .deb is an ar archive whose data.tar.* holds the files
        python3 - "$deb" "$mpi_root" <<'PY'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
position = 8  # after "!<arch>\n"
while position < len(data):
    name = data[position:position + 16].decode().strip().rstrip("/")
    size = int(data[position + 48:position + 58].decode().strip())
    body = data[position + 60:position + 60 + size]
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(sys.argv[2])
    position += 60 + size + (size % 2)
PY
      fi
    done
    # Debian names its wrappers mpicxx.openmpi etc. and makes the plain names with
    # update-alternatives, which dpkg-deb -x does not run. The links keep the plain name as
    # argv[0], from which opal_wrapper picks its wrapper data (mpicxx-wrapper-data.txt).
    for tool in mpicc mpicxx mpic++ mpirun mpiexec; do
      ln -sf "../usr/bin/$tool.openmpi" "$mpi_root/bin/$tool"
    done
    touch "$mpi_root/.unpacked"
  fi
  multiarch=x86_64-linux-gnu
  export PATH="$mpi_root/bin:$mpi_root/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$mpi_root/usr/lib/$multiarch/openmpi/lib:$mpi_root/usr/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Open MPI relocates everything under its prefix (/usr: libdir, pkglibdir with the MCA
  # components, pkgdatadir with the wrapper data and help files) by OPAL_PREFIX; Debian's
  # sysconfdir (/etc/openmpi) lies outside it and has a variable of its own.
  export OPAL_PREFIX=$mpi_root/usr OPAL_SYSCONFDIR=$mpi_root/etc/openmpi
  # PMIx (an external library in Debian) finds its components by its own install prefix.
  export PMIX_INSTALL_PREFIX=$mpi_root/usr/lib/$multiarch/pmix2
  export PMIX_MCA_mca_base_component_path=$mpi_root/usr/lib/$multiarch/pmix2/lib/pmix
  # mpirun insists on an rsh/ssh agent even for ranks on this machine only; none is installed
  # there, and none is used for local ranks.
  command -v ssh >/dev/null || command -v rsh >/dev/null || export OMPI_MCA_plm_rsh_agent=false
  if command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
    gpu_mpi_source="carried ($mpi_root)"
  fi
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "MPI: $gpu_mpi_source; mpicxx: $(command -v mpicxx || echo none); mpirun: $(command -v mpirun || echo none)"
if [[ $gpu_mpi_source != none ]]; then
  mpirun --version 2>&1 | head -1
fi
