// tools/process_group.h — the child processes `baton up` starts and stops.
//
// Each child runs in its own process group, so a Ctrl-C in the terminal
// reaches only `baton up`, which then stops the children in order (router
// first, to drain); and each child gets SIGTERM if `baton up` itself dies
// (PR_SET_PDEATHSIG), so no orphan keeps a port.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace baton::tools {

class ProcessGroup {
 public:
  struct Exit {
    std::string name;
    int status = 0;  // as waitpid reports it
    pid_t pid = 0;   // the process that exited
  };

  ProcessGroup() = default;
  ~ProcessGroup();  // SIGKILLs and reaps whatever still runs
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  Status spawn(const std::string& name, const std::vector<std::string>& argv);
  // Children that exited since the last call (never blocks).
  std::vector<Exit> reap();
  bool running(const std::string& name) const;
  // The pid of the running child `name`; 0 if there is none.
  pid_t pid(const std::string& name) const;
  // Sends `signal` to the child `name` if it runs.
  void signal(const std::string& name, int signal);
  // SIGTERM to `names`, up to `grace` for them to exit, then SIGKILL.
  void stop(const std::vector<std::string>& names, std::chrono::milliseconds grace);
  // Every name spawned (once each, whether or not it still runs).
  std::vector<std::string> names() const;

 private:
  struct Child {
    std::string name;
    pid_t pid;
    bool exited = false;
  };
  std::vector<Child> children_;
};

// "exited with 3", "killed by signal 9".
std::string describe_exit(int status);

}  // namespace baton::tools
