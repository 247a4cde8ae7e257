/* The fleet's command-line verbs, for cli/main.c: `kiri pull` and `kiri fleet keygen |
 * sign | verify | sync` (docs/fleet.md). Each takes the whole argv (argv[1] is the verb), prints
 * results to stdout and one-line errors and progress to stderr, and returns the exit status:
 * 0 success, 1 failure, 2 usage error. */
#ifndef KIRI_FLEET_CLI_H
#define KIRI_FLEET_CLI_H

int kiri_fleet_cli_pull(int argc, char **argv);
int kiri_fleet_cli_fleet(int argc, char **argv);

#endif
