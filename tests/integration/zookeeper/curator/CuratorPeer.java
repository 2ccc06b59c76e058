// A Curator peer for coord's tests: Apache Curator's recipes (Debian's
// libcurator-recipes-java 5.4) driven by a line protocol on stdin/stdout.
// The protocol is documented in tests/integration/zookeeper/_curator.py.
//
// Usage: java -cp <jars>:<dir> CuratorPeer <host:port[,host:port][/chroot]> [session ms]
//
// A chroot becomes Curator's namespace (created on first use), so that the peer's paths
// are the paths coord sees under the same chroot. Every command runs on the executor of
// its (recipe, path): Curator's mutexes belong to the thread that acquired them, so the
// release must run on that thread, and commands on one path keep their order while a
// blocked acquire on one path never holds up another.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.locks.StandardLockInternalsDriver;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.utils.ZKPaths;
import org.apache.zookeeper.KeeperException;

public final class CuratorPeer {
    private final CuratorFramework client;
    private final Map<String, ExecutorService> executors = new ConcurrentHashMap<>();
    private final Map<String, InterProcessMutex> mutexes = new ConcurrentHashMap<>();
    private final Map<String, String> mutexNodes = new ConcurrentHashMap<>();
    private final Map<String, InterProcessReadWriteLock> rwlocks = new ConcurrentHashMap<>();
    private final Map<String, InterProcessSemaphoreV2> semaphores = new ConcurrentHashMap<>();
    private final Map<String, Lease> leases = new ConcurrentHashMap<>();
    private final Map<String, LeaderLatch> latches = new ConcurrentHashMap<>();
    private final Map<String, LeaderSelector> selectors = new ConcurrentHashMap<>();
    private final Map<String, CountDownLatch> resignations = new ConcurrentHashMap<>();
    private final Map<String, CountDownLatch> terms = new ConcurrentHashMap<>();

    private CuratorPeer(CuratorFramework client) {
        this.client = client;
    }

    static void say(String line) {
        synchronized (System.out) {
            System.out.println(line);
            System.out.flush();
        }
    }

    static String oneLine(Throwable exc) {
        String text = exc.getClass().getSimpleName() + ": " + exc.getMessage();
        return text.replace('\n', ' ').replace('\r', ' ');
    }

    /** The mutex driver of Curator with the node it created remembered (no public getter). */
    private final class Driver extends StandardLockInternalsDriver {
        private final String path;

        Driver(String path) {
            this.path = path;
        }

        @Override
        public String createsTheLock(CuratorFramework c, String p, byte[] data) throws Exception {
            String ours = super.createsTheLock(c, p, data);
            mutexNodes.put(path, ZKPaths.getNodeFromPath(ours));
            return ours;
        }
    }

    private interface Command {
        void run() throws Exception;
    }

    private void on(String key, String line, Command command) {
        ExecutorService executor =
                executors.computeIfAbsent(key, k -> Executors.newSingleThreadExecutor(r -> {
                    Thread thread = new Thread(r, "peer " + k);
                    thread.setDaemon(true);
                    return thread;
                }));
        executor.execute(() -> {
            try {
                command.run();
            } catch (InterruptedException exc) {
                Thread.currentThread().interrupt();
                say("error " + line + ": interrupted");
            } catch (Exception exc) {
                say("error " + line + ": " + oneLine(exc));
            }
        });
    }

    private static <T> T held(Map<String, T> map, String path, String what) {
        T value = map.remove(path);
        if (value == null) {
            throw new IllegalStateException("no " + what + " held on " + path);
        }
        return value;
    }

    void handle(String line) {
        String[] words = line.trim().split("\\s+");
        String verb = words[0];
        if (verb.isEmpty()) {
            return;
        }
        if (words.length < 2) {
            say("error " + line + ": missing path");
            return;
        }
        String path = words[1];
        switch (verb) {
            case "lock" -> on("mutex " + path, line, () -> {
                InterProcessMutex mutex = mutexes.computeIfAbsent(
                        path, p -> new InterProcessMutex(client, p, new Driver(p)));
                mutex.acquire();
                say("locked " + path + " " + mutexNodes.get(path));
            });
            case "unlock" -> on("mutex " + path, line, () -> {
                InterProcessMutex mutex = mutexes.get(path);
                if (mutex == null) {
                    throw new IllegalStateException("no mutex on " + path);
                }
                mutex.release();
                if (!mutex.isAcquiredInThisProcess()) {
                    mutexes.remove(path);
                }
                say("unlocked " + path);
            });
            case "read", "write" -> on(verb + " " + path, line, () -> {
                InterProcessReadWriteLock rw =
                        rwlocks.computeIfAbsent(path, p -> new InterProcessReadWriteLock(client, p));
                InterProcessMutex lock = verb.equals("read") ? rw.readLock() : rw.writeLock();
                lock.acquire();
                say(verb + "-locked " + path);
            });
            case "unread", "unwrite" -> on(verb.substring(2) + " " + path, line, () -> {
                InterProcessReadWriteLock rw = rwlocks.get(path);
                if (rw == null) {
                    throw new IllegalStateException("no read-write lock on " + path);
                }
                InterProcessMutex lock = verb.equals("unread") ? rw.readLock() : rw.writeLock();
                lock.release();
                say(verb.substring(2) + "-unlocked " + path);
            });
            case "semaphore" -> on("semaphore " + path, line, () -> {
                if (words.length < 3) {
                    throw new IllegalArgumentException("usage: semaphore <path> <n>");
                }
                int n = Integer.parseInt(words[2]);
                InterProcessSemaphoreV2 semaphore = semaphores.computeIfAbsent(
                        path, p -> new InterProcessSemaphoreV2(client, p, n));
                Lease lease = semaphore.acquire();
                leases.put(path, lease);
                say("lease " + path + " " + lease.getNodeName());
            });
            case "unsemaphore" -> on("semaphore " + path, line, () -> {
                held(leases, path, "lease").close();
                say("unleased " + path);
            });
            case "latch" -> on("latch " + path, line, () -> {
                if (words.length < 3) {
                    throw new IllegalArgumentException("usage: latch <path> <id>");
                }
                String id = words[2];
                LeaderLatch latch = new LeaderLatch(client, path, id);
                if (latches.putIfAbsent(path, latch) != null) {
                    throw new IllegalStateException("a latch is already started on " + path);
                }
                latch.addListener(new LeaderLatchListener() {
                    @Override
                    public void isLeader() {
                        say("leader " + path + " " + id);
                    }

                    @Override
                    public void notLeader() {
                        say("not-leader " + path + " " + id);
                    }
                });
                latch.start();
            });
            case "unlatch" -> on("latch " + path, line, () -> {
                held(latches, path, "latch").close();
                say("unlatched " + path);
            });
            case "leader-of" -> on("query", line, () -> say("leader-of " + path + " " + leaderOf(
                    path, words.length > 2 ? words[2] : "latch")));
            case "selector" -> on("selector " + path, line, () -> select(path, words));
            case "unselect" -> on("selector " + path, line, () -> {
                LeaderSelector selector = held(selectors, path, "selector");
                CountDownLatch resign = resignations.remove(path);
                CountDownLatch ended = terms.remove(path);
                if (resign != null && ended != null && selector.hasLeadership()) {
                    resign.countDown();  // takeLeadership returns: the term ends on its own
                    ended.await(10, TimeUnit.SECONDS);
                }
                selector.close();  // a selector still waiting stops waiting
                say("unselected " + path);
            });
            default -> say("error " + line + ": unknown command " + verb);
        }
    }

    private String leaderOf(String path, String kind) throws Exception {
        Participant leader;
        try {
            leader = switch (kind) {
                case "latch" -> new LeaderLatch(client, path).getLeader();
                case "selector" -> new LeaderSelector(
                        client, path, new LeaderSelectorListenerAdapter() {
                            @Override
                            public void takeLeadership(CuratorFramework c) {}
                        }).getLeader();
                default -> throw new IllegalArgumentException("kind is latch or selector");
            };
        } catch (KeeperException.NoNodeException exc) {
            return "NONE";
        }
        return leader.getId().isEmpty() ? "NONE" : leader.getId();
    }

    private void select(String path, String[] words) {
        if (words.length < 3) {
            throw new IllegalArgumentException("usage: selector <path> <id>");
        }
        String id = words[2];
        CountDownLatch resign = new CountDownLatch(1);
        CountDownLatch ended = new CountDownLatch(1);
        LeaderSelector selector = new LeaderSelector(client, path, new LeaderSelectorListenerAdapter() {
            @Override
            public void takeLeadership(CuratorFramework c) throws Exception {
                say("selected " + path + " " + id);
                try {
                    resign.await();
                } catch (InterruptedException exc) {
                    say("not-selected " + path + " " + id);  // cancelled: SUSPENDED or LOST
                    throw exc;
                } finally {
                    ended.countDown();
                }
            }
        });
        selector.setId(id);
        if (selectors.putIfAbsent(path, selector) != null) {
            throw new IllegalStateException("a selector is already started on " + path);
        }
        resignations.put(path, resign);
        terms.put(path, ended);
        selector.start();  // autoRequeue stays off: one term, then it is done
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            say("error usage: CuratorPeer <connect string> [session timeout ms]");
            System.exit(2);
        }
        String connect = args[0];
        int sessionMs = args.length > 1 ? Integer.parseInt(args[1]) : 4000;
        String hosts = connect;
        String namespace = null;
        int slash = connect.indexOf('/');
        if (slash >= 0) {
            hosts = connect.substring(0, slash);
            namespace = connect.substring(slash + 1).replaceAll("/+$", "");
            if (namespace.isEmpty()) {
                namespace = null;
            }
        }
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(hosts)
                .namespace(namespace)
                .sessionTimeoutMs(sessionMs)
                .connectionTimeoutMs(Math.min(sessionMs, 15000))
                .retryPolicy(new ExponentialBackoffRetry(100, 5))
                .build();
        client.getConnectionStateListenable().addListener((c, state) -> say("state " + state));
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            say("error not connected to " + connect + " after 30 s");
            System.exit(1);
        }
        CuratorPeer peer = new CuratorPeer(client);
        say("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            try {
                peer.handle(line);
            } catch (RuntimeException exc) {
                say("error " + line + ": " + oneLine(exc));
            }
        }
        client.close();  // stdin closed: leave cleanly, the nodes go with the session
        System.exit(0);
    }
}
