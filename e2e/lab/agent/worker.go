package agent

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// podWorker owns one pod (by UID) from its first sight to the removal of its
// sandbox: one goroutine per pod, as in the kubelet, so a slow pod never
// holds up another.
type podWorker struct {
	a               *Agent
	uid             types.UID
	namespace, name string
	wake            chan struct{}

	sandboxID string
	// per container: its CRI id, restarts and readiness probe state
	containers map[string]*containerState
	lastStatus string // what was last written, to write only changes
}

type containerState struct {
	id        string
	restarts  int32
	startedAt time.Time
	ready     bool
	okRun     int32 // consecutive probe successes
	failRun   int32 // consecutive probe failures
	nextProbe time.Time
}

func newPodWorker(a *Agent, uid types.UID, namespace, name string) *podWorker {
	return &podWorker{a: a, uid: uid, namespace: namespace, name: name,
		wake: make(chan struct{}, 1), containers: map[string]*containerState{}}
}

func (w *podWorker) notify() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run syncs the pod whenever it changes and at least once a second (the
// readiness probes' clock) until the pod is gone and its sandbox removed.
func (w *podWorker) run(ctx context.Context) {
	log := klog.Background().WithValues("pod", w.namespace+"/"+w.name, "uid", w.uid)
	for {
		pod := w.currentPod()
		if pod == nil || pod.DeletionTimestamp != nil {
			if err := w.teardown(ctx, pod); err != nil {
				log.Error(err, "tear down pod; retrying")
			} else {
				log.Info("pod removed")
				return
			}
		} else if err := w.sync(ctx, pod); err != nil {
			log.Error(err, "sync pod; retrying")
		}
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-time.After(w.nextWake()):
		}
	}
}

// currentPod is the pod from the informer, nil when it is gone (or when
// the name now belongs to a new pod with another UID).
func (w *podWorker) currentPod() *corev1.Pod {
	if w.a.pods == nil {
		return nil
	}
	pod, err := w.a.pods.Pods(w.namespace).Get(w.name)
	if err != nil || pod.UID != w.uid {
		return nil
	}
	return pod
}

func (w *podWorker) nextWake() time.Duration {
	next := time.Second
	for _, c := range w.containers {
		if d := time.Until(c.nextProbe); c.id != "" && d > 0 && d < next {
			next = d
		}
	}
	return next
}

// sync makes the pod run and writes its status when it changed.
func (w *podWorker) sync(ctx context.Context, pod *corev1.Pod) error {
	if err := w.ensureRunning(ctx, pod); err != nil {
		// Still write what is known (e.g. Pending), then retry.
		w.writeStatus(ctx, pod, nil)
		return err
	}
	ips, err := w.sandboxIPs(ctx, pod)
	if err != nil {
		return err
	}
	w.probe(pod, ips)
	return w.writeStatus(ctx, pod, ips)
}

// teardown stops the containers (giving them the grace period, capped, to
// drain), removes the sandbox (containerd then runs the CNI DEL) and, for a
// pod being deleted, finishes the deletion as the kubelet does.
func (w *podWorker) teardown(ctx context.Context, pod *corev1.Pod) error {
	grace := int64(2)
	if pod != nil && pod.DeletionGracePeriodSeconds != nil {
		grace = min(*pod.DeletionGracePeriodSeconds, 10)
	}
	if err := w.removeSandboxes(ctx, grace); err != nil {
		return err
	}
	if pod == nil {
		return nil
	}
	err := w.a.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}
