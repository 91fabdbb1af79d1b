// Preloaded into the MPI processes of the sanitizer test run only: makes dlclose() a no-op so
// that Open MPI's plugins stay mapped until exit. Otherwise LeakSanitizer reports their
// allocations with "<unknown module>" frames that no suppression can name; with the plugins
// mapped, tests/sanitizers/lsan.supp suppresses exactly the MPI libraries' allocations.
extern "C" int dlclose(void* handle) {
  (void)handle;
  return 0;
}
