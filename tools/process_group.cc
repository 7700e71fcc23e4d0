// tools/process_group.cc — fork/exec, reaping and ordered stops.
#include "tools/process_group.h"

#include <algorithm>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <thread>

namespace baton::tools {

using namespace std::chrono_literals;

ProcessGroup::~ProcessGroup() {
  for (Child& child : children_) {
    if (!child.exited) ::kill(child.pid, SIGKILL);
  }
  for (Child& child : children_) {
    if (!child.exited) ::waitpid(child.pid, nullptr, 0);
  }
}

Status ProcessGroup::spawn(const std::string& name, const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t parent = ::getpid();
  // The parent's stop handlers only set a flag, in the child a flag in its
  // own copy of the parent: a SIGTERM between fork and execv (the parent's
  // death, its stop) must end the child, not be swallowed. Held off across
  // the fork, it reaches the child once its handlers are the defaults.
  sigset_t stops, before;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  ::pthread_sigmask(SIG_BLOCK, &stops, &before);
  pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
    return io_error("fork for " + name + ": " + std::strerror(error));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) _exit(127);  // the parent died before prctl
    ::execv(args[0], args.data());
    _exit(127);
  }
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  ::setpgid(pid, pid);
  children_.push_back({name, pid});
  return Status::ok();
}

std::vector<ProcessGroup::Exit> ProcessGroup::reap() {
  std::vector<Exit> exits;
  for (Child& child : children_) {
    if (child.exited) continue;
    int status = 0;
    if (::waitpid(child.pid, &status, WNOHANG) == child.pid) {
      child.exited = true;
      exits.push_back({child.name, status, child.pid});
    }
  }
  return exits;
}

bool ProcessGroup::running(const std::string& name) const {
  for (const Child& child : children_) {
    if (child.name == name && !child.exited) return true;  // a restart reuses the name
  }
  return false;
}

pid_t ProcessGroup::pid(const std::string& name) const {
  for (const Child& child : children_) {
    if (child.name == name && !child.exited) return child.pid;
  }
  return 0;
}

void ProcessGroup::signal(const std::string& name, int signal) {
  for (Child& child : children_) {
    if (child.name == name && !child.exited) ::kill(child.pid, signal);
  }
}

void ProcessGroup::stop(const std::vector<std::string>& names, std::chrono::milliseconds grace) {
  for (Child& child : children_) {
    for (const std::string& name : names) {
      if (child.name == name && !child.exited) ::kill(child.pid, SIGTERM);
    }
  }
  auto deadline = std::chrono::steady_clock::now() + grace;
  auto any_running = [&] {
    for (const std::string& name : names) {
      if (running(name)) return true;
    }
    return false;
  };
  while (any_running() && std::chrono::steady_clock::now() < deadline) {
    reap();
    std::this_thread::sleep_for(20ms);
  }
  for (Child& child : children_) {
    for (const std::string& name : names) {
      if (child.name == name && !child.exited) {
        ::kill(child.pid, SIGKILL);
        ::waitpid(child.pid, nullptr, 0);
        child.exited = true;
      }
    }
  }
}

std::vector<std::string> ProcessGroup::names() const {
  std::vector<std::string> out;
  for (const Child& child : children_)
    if (std::find(out.begin(), out.end(), child.name) == out.end()) out.push_back(child.name);
  return out;
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped";
}

}  // namespace baton::tools
