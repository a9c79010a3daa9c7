package dns

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
)

// encodePB encodes obj as the API server sends it as protobuf.
func encodePB(t testing.TB, obj runtime.Object) []byte {
	t.Helper()
	enc := clientscheme.Codecs.EncoderForVersion(protobuf.NewSerializer(clientscheme.Scheme, clientscheme.Scheme), corev1.SchemeGroupVersion)
	b, err := runtime.Encode(enc, obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wirePods are pods of every shape the pods' view tells apart, and one
// with the spec and status a real pod carries around what it reads.
func wirePods() []*corev1.Pod {
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "team-a", Name: name, ResourceVersion: "1234"}
	}
	status := func(phase corev1.PodPhase, ips ...string) corev1.PodStatus {
		s := corev1.PodStatus{Phase: phase}
		for _, ip := range ips {
			s.PodIPs = append(s.PodIPs, corev1.PodIP{IP: ip})
		}
		if len(ips) > 0 {
			s.PodIP = ips[0]
		}
		return s
	}
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "web-7d9f-abcde", ResourceVersion: "99",
			UID: "0b1c", GenerateName: "web-7d9f-", Labels: map[string]string{"app": "web"},
			Annotations:     map[string]string{"note": "k8s.io/initial-events-end"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9f", UID: "1"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}}},
		Spec: corev1.PodSpec{NodeName: "node-1", Hostname: "web", Subdomain: "web",
			Containers: []corev1.Container{{Name: "web", Image: "nginx", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
		Status: status(corev1.PodRunning, "10.244.1.9", "fd00:10:244:1::9"),
	}
	full.Status.HostIP = "192.168.0.2"
	full.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	full.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", Ready: true, RestartCount: 2}}
	return []*corev1.Pod{
		{ObjectMeta: meta("two-families"), Status: status(corev1.PodRunning, "10.244.0.5", "fd00:10:244::5")},
		{ObjectMeta: meta("podip-alone"), Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.6"}},
		{ObjectMeta: meta("v4-mapped"), Status: status(corev1.PodRunning, "::ffff:10.244.0.7")},
		{ObjectMeta: meta("succeeded"), Status: status(corev1.PodSucceeded, "10.244.0.8")},
		{ObjectMeta: meta("failed"), Status: status(corev1.PodFailed, "10.244.0.9")},
		{ObjectMeta: meta("pending"), Status: corev1.PodStatus{Phase: corev1.PodPending}},
		{ObjectMeta: meta("bad-address"), Status: status(corev1.PodRunning, "10.244.0.300", "10.244.0.10")},
		full,
	}
}

// TestTheWireReaderKeepsWhatTheTypedPathKeeps decodes each pod both ways:
// the wire reader's podInfo must equal the one read from a decoded Pod,
// with the pod's version.
func TestTheWireReaderKeepsWhatTheTypedPathKeeps(t *testing.T) {
	for _, pod := range wirePods() {
		t.Run(pod.Name, func(t *testing.T) {
			got, err := decodePodWire(encodePB(t, pod))
			if err != nil {
				t.Fatal(err)
			}
			want := *toPodInfo(pod)
			want.rv = pod.ResourceVersion
			if p := got.(*podInfo); *p != want {
				t.Errorf("read %+v, want %+v", *p, want)
			}
		})
	}
}

// TestTheWireReaderReadsListsBookmarksAndStatuses covers the other
// objects a list or watch of pods brings.
func TestTheWireReaderReadsListsBookmarksAndStatuses(t *testing.T) {
	pods := wirePods()
	list := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "77", Continue: "next-page"}}
	for _, p := range pods {
		list.Items = append(list.Items, *p)
	}
	got, err := decodePodWire(encodePB(t, list))
	if err != nil {
		t.Fatal(err)
	}
	l := got.(*podInfoList)
	if l.ResourceVersion != "77" || l.Continue != "next-page" || len(l.Items) != len(pods) {
		t.Fatalf("list at %q, continue %q, %d items; want 77, next-page, %d", l.ResourceVersion, l.Continue, len(l.Items), len(pods))
	}
	for i, p := range l.Items {
		if p.name != pods[i].Name || p.addrs != toPodInfo(pods[i]).addrs {
			t.Errorf("item %d: %+v, want %s", i, *p, pods[i].Name)
		}
	}

	// The bookmark that ends a watch-list's initial events carries the
	// annotation and a version alone; the reflector reads both through
	// the object's metadata.
	bookmark := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "80",
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	got, err = decodePodWire(encodePB(t, bookmark))
	if err != nil {
		t.Fatal(err)
	}
	m := got.(*podInfo).GetObjectMeta()
	if m.GetResourceVersion() != "80" || m.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
		t.Errorf("bookmark read as version %q, annotations %v", m.GetResourceVersion(), m.GetAnnotations())
	}
	if m := pods[len(pods)-1]; m.Annotations["note"] == "" {
		t.Fatal("the full pod lost its annotation")
	}
	if got, _ := decodePodWire(encodePB(t, pods[len(pods)-1])); got.(*podInfo).initialEventsEnd {
		t.Error("an annotation's value naming the bookmark's key made a bookmark")
	}

	// An error's Status goes to client-go's decoder.
	status := apierrors.NewResourceExpired("too old resource version").Status()
	d := podDecoder{std: protobuf.NewSerializer(clientscheme.Scheme, clientscheme.Scheme)}
	obj, gvk, err := d.Decode(encodePB(t, &status), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := obj.(*metav1.Status); !ok || s.Code != 410 || gvk.Kind != "Status" {
		t.Errorf("a Status decoded as %T %+v (%v), want the 410 Status", obj, obj, gvk)
	}
	obj, gvk, err = d.Decode(encodePB(t, pods[0]), nil, nil)
	if _, ok := obj.(*podInfo); err != nil || !ok || *gvk != (schema.GroupVersionKind{Version: "v1", Kind: "Pod"}) {
		t.Errorf("a Pod decoded as %T, %v, %v", obj, gvk, err)
	}
}

// TestTheWireReaderRefusesBrokenPods feeds every cut of an encoded pod and
// bytes that are no object: an error each time, never a panic or a pod
// that a reflector would take.
func TestTheWireReaderRefusesBrokenPods(t *testing.T) {
	pod := wirePods()[len(wirePods())-1]
	whole := encodePB(t, pod)
	// The envelope ends with its content encoding and type, both empty:
	// two fields of two bytes after the pod.
	podEnd := len(whole) - 4
	for n := range len(whole) {
		p, err := decodePodWire(whole[:n])
		switch {
		case n < podEnd && err == nil:
			t.Fatalf("cut at %d of %d: read %+v, want an error", n, len(whole), p)
		case n >= podEnd && err == nil && p.(*podInfo).name != pod.Name:
			t.Fatalf("cut at %d of %d, after the pod: read %+v", n, len(whole), p)
		}
	}
	for _, b := range [][]byte{nil, []byte("{}"), append(slices.Clone(protobufMagic), 0xff, 0xff, 0xff)} {
		if _, err := decodePodWire(b); err == nil {
			t.Errorf("%q: no error", b)
		}
	}
}

func FuzzWireReader(f *testing.F) {
	for _, p := range wirePods() {
		f.Add(encodePB(f, p))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		obj, err := decodePodWire(b)
		if err != nil {
			return
		}
		if p, ok := obj.(*podInfo); ok {
			for _, a := range p.addrs.unpack() {
				if !a.IsValid() || a.Is4In6() {
					t.Fatalf("read an address %v", a)
				}
			}
		}
	})
}
