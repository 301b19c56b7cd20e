// pstrain certs --out=DIR [--nodes_out=NODES] [--num_ps=N --num_workers=M]
//               [--job=ID] [--hosts=HOST,...]: a cluster's CA and
// certificates (common/tls.h) made with OpenSSL: ca.pem and ca.key (kept in
// DIR to make more later; keep ca.key off the nodes), and a key and
// certificate for the coordinator and the administrator (the CLI; both
// only when DIR has none yet: remove them to renew), ps-0..N-1
// (server and client) and worker-0..M-1 of job ID ("*", the default: any
// job of this CA, said in a warning line on stderr). --nodes_out copies
// what the nodes need (ca.pem and the tasks' files; no ca.key, no admin or
// coordinator key) into a folder of its own: a new one, or one of this
// user's holding none of those files and no ca.key, admin.key or
// coordinator.key, and never --out's folder however spelled (checked
// before anything is written; nothing there is ever replaced).
// --hosts adds host names or addresses to every certificate, for tools
// that reach a server by name.
#ifndef PSTRAIN_CLI_CERTS_COMMAND_H_
#define PSTRAIN_CLI_CERTS_COMMAND_H_

#include <string>
#include <vector>

namespace pstrain {

// Exit code: 0 done, 2 bad flags, a --nodes_out refused as above (one line
// naming it; nothing written) or an unwritable folder.
int CertsCommand(const std::vector<std::string>& args);

}  // namespace pstrain

#endif  // PSTRAIN_CLI_CERTS_COMMAND_H_
